// Expert parallelism's group over a communicator (nn::ExpertParallelGroup): the counts and
// the rows exchanged by Communicator::all_to_all (MPI_Ialltoallv on the CPU, grouped NCCL
// sends and receives on GPUs), counted and watched like every collective.
#pragma once

#include <cstdint>
#include <vector>

#include <string>

#include "collectives/communicator.h"
#include "runtime/nn/expert_parallel.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/module.h"
#include "runtime/parallel/transfer_stream.h"

namespace fsdp {

class CommunicatorExpertParallelGroup : public nn::ExpertParallelGroup {
 public:
  // `overlap`: started exchanges run on the group's own stream on GPUs (the compute goes on
  // meanwhile); otherwise every exchange runs in order on the compute stream.
  explicit CommunicatorExpertParallelGroup(Communicator& comm, bool overlap = false)
      : comm_(comm), overlap_(overlap) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  // On a GPU the counts go through device memory (NCCL) and the host waits for them.
  std::vector<int64_t> exchange_counts(Context& ctx, const std::vector<int64_t>& counts) override;
  void exchange_rows(Context& ctx, const Tensor& send, const std::vector<size_t>& send_rows,
                     const Tensor& recv, const std::vector<size_t>& recv_rows) override;
  // On a GPU with `overlap`: the all-to-all on the group's own stream, after what ctx's
  // stream has queued so far (the MoE layer's shared expert runs meanwhile).
  std::unique_ptr<nn::PendingTransfer> start_exchange_rows(Context& ctx, const Tensor& send,
                                                           const std::vector<size_t>& send_rows,
                                                           const Tensor& recv,
                                                           const std::vector<size_t>& recv_rows) override;

 private:
  // The all-to-all of exchange_rows, queued on `stream`.
  Work issue_exchange_rows(const Tensor& send, const std::vector<size_t>& send_rows,
                           const Tensor& recv, const std::vector<size_t>& recv_rows,
                           const Stream& stream);

  Communicator& comm_;
  bool overlap_;
  TransferStream transfers_;  // the overlapped exchanges' stream
};

// A group that only plans (the dry run, memory estimates): rank `rank` of `size`, never
// exchanging anything (its exchanges throw).
class PlanningExpertParallelGroup : public nn::ExpertParallelGroup {
 public:
  PlanningExpertParallelGroup(int size, int rank) : size_(size), rank_(rank) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  std::vector<int64_t> exchange_counts(Context& ctx, const std::vector<int64_t>& counts) override;
  void exchange_rows(Context& ctx, const Tensor& send, const std::vector<size_t>& send_rows,
                     const Tensor& recv, const std::vector<size_t>& recv_rows) override;

 private:
  int size_, rank_;
};

// Expert parallelism applied from outside the model: every MoE layer `table` names in
// `model` (style experts; specs, before FSDP or materialization) keeps experts [r E/ep, (r + 1) E/ep) of group rank r
// (ExpertParallelLayout): its experts' weights are sliced along dim 0 (ParallelSlice, so
// they initialize, save and load as those experts of the full tensor) and placed split
// over the expert-parallel group (nn::Placement::SplitOver::expert_parallel: FSDP shards
// them over the expert-data-parallel group), and the layer exchanges its rows with `group`.
// Returns one line per layer ("layers.1.mlp: experts 4..7 of 16"). A group of one leaves
// the model as it is. Throws ConfigError naming the layer when its experts do not split
// into equal parts.
std::vector<std::string> apply_expert_parallel(nn::Module& model, const nn::LayerTable& table,
                                               nn::ExpertParallelGroup& group);

}  // namespace fsdp
