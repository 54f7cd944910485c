#include "runtime/nn/expert_parallel.h"

#include <utility>

#include "kernels/ops.h"
#include "runtime/core/error.h"

namespace fsdp::nn {
namespace {

size_t total(const std::vector<size_t>& v) {
  size_t n = 0;
  for (size_t x : v) n += x;
  return n;
}

// out (M, C) = rows of x (M, C) picked by map (M) i32: out[i] = x[map[i]].
Tensor gather_rows(Context& ctx, const Tensor& x, const Tensor& map) {
  const Tensor out = ctx.empty(x.shape(), x.dtype());
  if (x.size(0) > 0) ops::moe_permute(ctx, out, x, map);
  return out;
}

void check_rows(const Tensor& x, int64_t rows, const char* what, const char* role) {
  FSDP_CHECK(x.dim() == 2 && x.size(0) == rows, ShapeError, what, ": ", role, " ", x.str(),
             " must be (", rows, ", C)");
}

}  // namespace

std::unique_ptr<PendingTransfer> ExpertParallelGroup::start_exchange_rows(
    Context& ctx, const Tensor& send, const std::vector<size_t>& send_rows, const Tensor& recv,
    const std::vector<size_t>& recv_rows) {
  exchange_rows(ctx, send, send_rows, recv, recv_rows);
  return std::make_unique<CompletedTransfer>();
}

// The rows of x, send_rows[p] for rank p, on their way: recv_rows[s] from rank s.
PendingRows::PendingRows(Context& ctx, ExpertParallelGroup& group, const Tensor& x,
                         const std::vector<size_t>& send_rows,
                         const std::vector<size_t>& recv_rows, Tensor regroup)
    : ctx_(&ctx),
      send_(ops::contiguous(ctx, x)),
      recv_(ctx.empty(Shape{int64_t(total(recv_rows)), x.size(1)}, x.dtype())),
      regroup_(std::move(regroup)) {
  pending_ = group.start_exchange_rows(ctx, send_, send_rows, recv_, recv_rows);
}

// From the rows' ranks to the experts' (source-major, then regrouped expert-major).
PendingRows PendingRows::to_experts(Context& ctx, ExpertParallelGroup& group,
                                    const ExpertExchange& e, const Tensor& x) {
  check_rows(x, int64_t(total(e.send_rows)), "rows_to_experts", "x");
  return PendingRows(ctx, group, x, e.send_rows, e.regroup.recv_counts, e.gather);
}

// From the experts' ranks back to the rows' own (regrouped source-major before sending).
PendingRows PendingRows::from_experts(Context& ctx, ExpertParallelGroup& group,
                                      const ExpertExchange& e, const Tensor& y) {
  check_rows(y, int64_t(e.regroup.gather.size()), "rows_from_experts", "y");
  return PendingRows(ctx, group, gather_rows(ctx, ops::contiguous(ctx, y), e.scatter),
                     e.regroup.recv_counts, e.send_rows, Tensor());
}

Tensor PendingRows::finish(Context& ctx) {
  FSDP_CHECK(pending_ != nullptr, ValueError, "PendingRows::finish: already finished");
  pending_->finish(ctx);
  pending_.reset();
  send_ = Tensor();
  const Tensor received = std::move(recv_);
  return regroup_.defined() ? gather_rows(ctx, received, regroup_) : received;
}

PendingRows::~PendingRows() {
  if (!pending_) return;
  try {
    pending_->finish(*ctx_);
  } catch (...) {  // already failing: the first error is the one reported
  }
}

Tensor rows_to_experts(Context& ctx, ExpertParallelGroup& group, const ExpertExchange& e,
                       const Tensor& x) {
  return PendingRows::to_experts(ctx, group, e, x).finish(ctx);
}

Tensor rows_from_experts(Context& ctx, ExpertParallelGroup& group, const ExpertExchange& e,
                         const Tensor& y) {
  return PendingRows::from_experts(ctx, group, e, y).finish(ctx);
}

std::shared_ptr<const ExpertExchange> plan_expert_exchange(Context& ctx,
                                                           const std::vector<int64_t>& counts,
                                                           const ExpertParallelLayout& layout,
                                                           ExpertParallelGroup& group) {
  FSDP_CHECK(group.size() == layout.ep && group.rank() == layout.rank, ValueError,
             "expert exchange: the layout is rank ", layout.rank, " of ", layout.ep,
             ", the group rank ", group.rank(), " of ", group.size());
  auto e = std::make_shared<ExpertExchange>();
  e->layout = layout;
  e->send_rows = layout.send_counts(counts);
  // Each rank's counts of every rank's experts: the parts of `counts` (E) in rank order.
  e->regroup = layout.regroup(group.exchange_counts(ctx, counts));
  const int64_t received = int64_t(e->regroup.gather.size());
  e->gather = ops::from_host<int32_t>(ctx, e->regroup.gather, Shape{received});
  e->scatter = ops::from_host<int32_t>(ctx, e->regroup.scatter, Shape{received});
  return e;
}

}  // namespace fsdp::nn
