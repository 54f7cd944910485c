#include "runtime/parallel/context_parallel.h"

#include "runtime/core/error.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe.h"

namespace fsdp {

nn::ContextParallelComm context_parallel_comm(const std::string& name) {
  if (name == "p2p") return nn::ContextParallelComm::ring;
  FSDP_CHECK(name == "all_gather", ConfigError, "context parallelism: cp_comm_type \"", name,
             "\" is neither \"p2p\" nor \"all_gather\"");
  return nn::ContextParallelComm::all_gather;
}

std::vector<std::string> apply_context_parallel(nn::Module& model,
                                                const nn::VocabularyTables& vocabulary,
                                                const nn::LayerTable& table,
                                                nn::ParallelGroup& group, int64_t seq_len,
                                                nn::ContextParallelComm comm) {
  std::vector<std::string> report;
  if (group.size() == 1) return report;
  const auto layout = nn::ContextParallelLayout::make(seq_len, group.size(), group.rank());
  for (const nn::StyledLayer& l : table.resolve(model)) {
    if (l.row->style == nn::LayerStyle::attention) {
      auto& a = nn::styled_as<nn::CausalSelfAttention>(l, "CausalSelfAttention");
      a.set_context_parallel(layout, &group, comm);
      report.push_back(a.name() + (comm == nn::ContextParallelComm::ring
                                       ? ": context-parallel (keys and values around a ring)"
                                       : ": context-parallel (keys and values all-gathered)"));
    } else if (l.row->style == nn::LayerStyle::experts) {
      auto& moe = nn::styled_as<nn::MoELayer>(l, "MoELayer");
      moe.set_context_parallel(&group);
      report.push_back(moe.name() + ": balancing loss over the whole sequences");
    }
  }
  if (vocabulary.positions) {
    nn::Placement positions = vocabulary.positions->placement();
    positions.sequence_chunks = layout;
    vocabulary.positions->set_placement(positions);
    report.push_back(vocabulary.positions->name() + ": read at this rank's positions");
  }
  return report;
}

std::vector<int32_t> split_sequences(const std::vector<int32_t>& rows, int64_t batch,
                                     const nn::ContextParallelLayout& layout) {
  const int64_t t = layout.seq, c = layout.chunk();
  FSDP_CHECK(int64_t(rows.size()) == batch * t, ShapeError, "split_sequences: ", rows.size(),
             " tokens for ", batch, " sequences of ", t);
  std::vector<int32_t> out;
  out.reserve(size_t(batch * layout.local_seq()));
  for (int64_t b = 0; b < batch; ++b)
    for (int i = 0; i < 2; ++i) {
      const auto first = rows.begin() + b * t + layout.chunk_begin(i);
      out.insert(out.end(), first, first + c);
    }
  return out;
}

}  // namespace fsdp
