// Expert parallelism's group over a communicator (nn::ExpertParallelGroup): the counts and
// the rows exchanged by Communicator::all_to_all (MPI_Ialltoallv on the CPU, grouped NCCL
// sends and receives on GPUs), counted and watched like every collective.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/nn/expert_parallel.h"

namespace fsdp {

class CommunicatorExpertParallelGroup : public nn::ExpertParallelGroup {
 public:
  explicit CommunicatorExpertParallelGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  // On a GPU the counts go through device memory (NCCL) and the host waits for them.
  std::vector<int64_t> exchange_counts(Context& ctx, const std::vector<int64_t>& counts) override;
  void exchange_rows(Context& ctx, const Tensor& send, const std::vector<size_t>& send_rows,
                     const Tensor& recv, const std::vector<size_t>& recv_rows) override;

 private:
  Communicator& comm_;
};

}  // namespace fsdp
