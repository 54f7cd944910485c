#include "runtime/parallel/expert_parallel.h"

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "runtime/nn/moe.h"

namespace fsdp {

std::vector<int64_t> CommunicatorExpertParallelGroup::exchange_counts(
    Context& ctx, const std::vector<int64_t>& counts) {
  const size_t ranks = size_t(comm_.size());
  FSDP_CHECK(counts.size() % ranks == 0, ShapeError, "exchange_counts on group '", comm_.name(),
             "': ", counts.size(), " counts do not split into ", ranks, " equal parts");
  const size_t part = counts.size() / ranks;
  const std::vector<size_t> parts(ranks, part);
  const Tensor send = ops::from_host<int64_t>(ctx, counts, Shape{int64_t(counts.size())});
  const Tensor recv = ctx.empty(send.shape(), DType::i64);
  comm_.all_to_all(send.data_ptr(), parts, recv.data_ptr(), parts, DType::i64, ctx.stream());
  return ops::to_vector<int64_t>(ctx, recv);
}

void CommunicatorExpertParallelGroup::exchange_rows(Context& ctx, const Tensor& send,
                                                    const std::vector<size_t>& send_rows,
                                                    const Tensor& recv,
                                                    const std::vector<size_t>& recv_rows) {
  issue_exchange_rows(send, send_rows, recv, recv_rows, ctx.stream());
}

std::unique_ptr<nn::PendingTransfer> CommunicatorExpertParallelGroup::start_exchange_rows(
    Context& ctx, const Tensor& send, const std::vector<size_t>& send_rows, const Tensor& recv,
    const std::vector<size_t>& recv_rows) {
  if (!ctx.is_cuda() || !overlap_)
    return nn::ExpertParallelGroup::start_exchange_rows(ctx, send, send_rows, recv, recv_rows);
  auto t = std::make_unique<CommunicatorTransfer>();
  t->work.push_back(issue_exchange_rows(send, send_rows, recv, recv_rows, transfers_.after(ctx)));
  return t;
}

Work CommunicatorExpertParallelGroup::issue_exchange_rows(const Tensor& send,
                                                          const std::vector<size_t>& send_rows,
                                                          const Tensor& recv,
                                                          const std::vector<size_t>& recv_rows,
                                                          const Stream& stream) {
  FSDP_CHECK(send.is_contiguous() && recv.is_contiguous() && send.dim() == 2 && recv.dim() == 2 &&
                 send.size(1) == recv.size(1) && send.dtype() == recv.dtype(),
             ShapeError, "exchange_rows on group '", comm_.name(), "': ", send.str(), " and ",
             recv.str(), " must be contiguous rows of one width and dtype");
  const size_t width = size_t(send.size(1));
  std::vector<size_t> send_counts, recv_counts;
  for (size_t r : send_rows) send_counts.push_back(r * width);
  for (size_t r : recv_rows) recv_counts.push_back(r * width);
  return comm_.all_to_all(send.numel() ? send.data_ptr() : nullptr, send_counts,
                          recv.numel() ? recv.data_ptr() : nullptr, recv_counts, send.dtype(),
                          stream);
}

std::vector<int64_t> PlanningExpertParallelGroup::exchange_counts(Context&,
                                                                  const std::vector<int64_t>&) {
  FSDP_THROW(ValueError, "a planning expert-parallel group exchanges nothing");
}

void PlanningExpertParallelGroup::exchange_rows(Context&, const Tensor&, const std::vector<size_t>&,
                                                const Tensor&, const std::vector<size_t>&) {
  FSDP_THROW(ValueError, "a planning expert-parallel group exchanges nothing");
}

std::vector<std::string> apply_expert_parallel(nn::Module& model, const nn::LayerTable& table,
                                               nn::ExpertParallelGroup& group) {
  std::vector<std::string> report;
  if (group.size() == 1) return report;
  for (const nn::StyledLayer& l : table.layers(model, nn::LayerStyle::experts)) {
    nn::MoELayer* layer = &nn::styled_as<nn::MoELayer>(l, "MoELayer");
    const int64_t E = layer->options().experts;
    FSDP_CHECK(E % group.size() == 0, ConfigError, layer->name(), ": its ", E, " experts do not ",
               "split over 'model.expert_model_parallel_size' ", group.size(), " ranks");
    const nn::ExpertParallelLayout layout = nn::ExpertParallelLayout::make(E, group.size(), group.rank());
    const int64_t first = layout.first_expert(layout.rank), last = first + layout.local_experts();
    for (nn::Parameter* p : {&layer->experts.fc(), &layer->experts.proj()}) {
      FSDP_CHECK(!p->parallel_slice(), ConfigError, p->name(), " is already split (",
                 p->parallel_slice()->str(), "): expert parallelism does not compose with that");
      nn::Placement experts = p->placement();
      experts.slice = nn::ParallelSlice{p->shape(), 0, {{first, last}}};
      experts.split_over = nn::Placement::SplitOver::expert_parallel;
      p->set_placement(std::move(experts));
    }
    layer->set_expert_parallel(&group);
    report.push_back(str_cat(layer->name(), ": experts ", first, "..", last - 1, " of ", E));
  }
  return report;
}

}  // namespace fsdp
