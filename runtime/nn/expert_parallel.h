// What expert parallelism communicates, without the layers knowing how: the tokens' rows
// go to the ranks that hold their experts (dispatch) and come back (combine). The MoE layer
// records their backward itself (the same exchanges the other way). runtime/parallel
// implements the group over a communicator.
//
// Shapes: R rows of this rank's tokens grouped by expert in global expert order (as
// ops::moe_sort_by_expert and ops::moe_permute give them), C channels; R' rows of this
// rank's local experts from every rank, expert-major (for each local expert, rank 0's rows,
// then rank 1's, ...: the order a single process holding every rank's tokens in rank order
// gives them; see ExpertParallelLayout).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/expert_parallel_layout.h"
#include "runtime/nn/pending_transfer.h"

namespace fsdp::nn {

class ExpertParallelGroup {
 public:
  virtual ~ExpertParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // `counts` (size() x n, host): part p for rank p. Returns (size() x n): part s from rank
  // s. Every rank of the group calls it with the same n. Waits for the values.
  virtual std::vector<int64_t> exchange_counts(Context& ctx, const std::vector<int64_t>& counts) = 0;
  // The rows of `send` (contiguous, (sum send_rows, C)), send_rows[p] of them for rank p in
  // rank order, into `recv` ((sum recv_rows, C)), recv_rows[s] from rank s; queued on ctx's
  // stream.
  virtual void exchange_rows(Context& ctx, const Tensor& send, const std::vector<size_t>& send_rows,
                             const Tensor& recv, const std::vector<size_t>& recv_rows) = 0;
  // exchange_rows, started now and finished by the returned transfer: on a GPU it runs beside
  // ctx's stream, so that the caller computes meanwhile (neither tensor may be read or
  // written until finish()). By default, and on the CPU, it completes here.
  virtual std::unique_ptr<PendingTransfer> start_exchange_rows(Context& ctx, const Tensor& send,
                                                               const std::vector<size_t>& send_rows,
                                                               const Tensor& recv,
                                                               const std::vector<size_t>& recv_rows);
};

// One dispatch's plan, shared with the combine that returns its rows.
struct ExpertExchange {
  ExpertParallelLayout layout;
  std::vector<size_t> send_rows;       // (ep) this rank's rows for each rank
  ExpertParallelLayout::Regroup regroup;
  Tensor gather, scatter;              // regroup's maps on ctx's device, i32
};

// The plan of one exchange: `counts` (E) are this rank's rows per expert in global expert
// order; the counts are exchanged with the group first (the host waits for them).
std::shared_ptr<const ExpertExchange> plan_expert_exchange(Context& ctx,
                                                           const std::vector<int64_t>& counts,
                                                           const ExpertParallelLayout& layout,
                                                           ExpertParallelGroup& group);
// The exchanges themselves, outside any tape (a layer that records its own backward uses
// them in both directions): rows (R, C) grouped by expert -> (R', C) of this rank's experts,
// expert-major; and back.
Tensor rows_to_experts(Context& ctx, ExpertParallelGroup& group, const ExpertExchange& exchange,
                       const Tensor& x);
Tensor rows_from_experts(Context& ctx, ExpertParallelGroup& group, const ExpertExchange& exchange,
                         const Tensor& y);

// The same exchanges in two halves, so that the caller computes while the rows travel (the
// MoE layer's shared expert, its router's backward): start sends, finish() makes ctx's stream
// wait for the rows and returns them as the one-call version does. Keeps the rows it sends
// alive until finish(); one never finished (an exception in between) makes ctx's stream wait
// for it when destroyed, so its buffers are not reused while the transfer runs.
class PendingRows {
 public:
  static PendingRows to_experts(Context& ctx, ExpertParallelGroup& group,
                                const ExpertExchange& exchange, const Tensor& x);
  static PendingRows from_experts(Context& ctx, ExpertParallelGroup& group,
                                  const ExpertExchange& exchange, const Tensor& y);
  Tensor finish(Context& ctx);

  PendingRows(PendingRows&&) = default;
  PendingRows& operator=(PendingRows&&) = delete;
  ~PendingRows();

 private:
  PendingRows(Context& ctx, ExpertParallelGroup& group, const Tensor& x,
              const std::vector<size_t>& send_rows, const std::vector<size_t>& recv_rows,
              Tensor regroup);
  Context* ctx_;
  Tensor send_, recv_;
  Tensor regroup_;  // to_experts: the map from source-major to expert-major rows
  std::unique_ptr<PendingTransfer> pending_;
};

}  // namespace fsdp::nn
