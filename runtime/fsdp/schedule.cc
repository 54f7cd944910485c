// ShardedModel: the per-step schedule. Module hooks gather weights ahead of use and reduce
// gradients as soon as a unit's backward is done; the step functions finish the reductions,
// compute the global gradient norm and make updated weights visible again.
#include <algorithm>
#include <cmath>

#include "kernels/block_ops.h"
#include "kernels/ops.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/fsdp/unit.h"

namespace fsdp {
namespace {

// An event marking the current end of `stream`'s queue.
Event mark(const Stream& stream) {
  Event e;
  e.record(stream);
  return e;
}

}  // namespace

// ---------------------------------------------------------------- hooks

void ShardedModel::attach_hooks() {
  // A unit of several blocks is gathered before its first block's forward and released after
  // its last's; in backward, gathered (and given fresh gradient buffers) before its last
  // block's backward, reduced after its first's. Every block's forward, recomputed in
  // backward included, waits for the gather.
  for (auto& up : units_) {
    const int u = up->index;
    nn::Module* first = up->modules.front();
    nn::Module* last = up->modules.back();
    for (nn::Module* m : up->modules) {
      const bool is_first = m == first;
      hooks_.emplace_back(m, m->add_hook(nn::HookPoint::PreForward,
                                         [this, u, is_first](nn::Module&, autograd::Graph& g) {
                                           if (is_first || g.recomputing()) on_pre_forward(u, g);
                                           else wait_gathered(u);
                                         }));
    }
    hooks_.emplace_back(last, last->add_hook(nn::HookPoint::PostForward,
                                             [this, u](nn::Module&, autograd::Graph& g) { on_post_forward(u, g); }));
    hooks_.emplace_back(last, last->add_hook(nn::HookPoint::PreBackward,
                                             [this, u](nn::Module&, autograd::Graph& g) { on_pre_backward(u, g); }));
    hooks_.emplace_back(first, first->add_hook(nn::HookPoint::PostBackward,
                                               [this, u](nn::Module&, autograd::Graph& g) { on_post_backward(u, g); }));
  }
}

void ShardedModel::on_pre_forward(int unit, autograd::Graph& g) {
  if (g.recomputing()) {
    // The recomputed forward runs inside backward: pre-backward gathered the weights.
    wait_gathered(unit);
    return;
  }
  if (zero3()) issue_gather(unit);
  wait_gathered(unit);
  if (zero3()) prefetch_from(unit, +1);
}

void ShardedModel::on_post_forward(int unit, autograd::Graph& g) {
  if (!zero3() || g.recomputing()) return;
  const bool backward_follows = g.grad_enabled();
  if (is_root(unit)) {
    if (!backward_follows) release_gathered(unit);
    return;
  }
  // The last block's weights are needed again right away by its backward: keep them.
  const bool last_block = unit == blocks_.back();
  if (backward_follows && last_block) return;
  release_gathered(unit);
}

void ShardedModel::on_pre_backward(int unit, autograd::Graph&) {
  Unit& u = *units_[size_t(unit)];
  if (zero3()) {
    issue_gather(unit);
    wait_gathered(unit);
    prefetch_from(unit, -1);
  }
  if (grads_sharded()) {
    // A fresh full-gradient buffer for this micro-batch's backward of the unit.
    Tensor full;
    if (is_root(unit)) {
      full = u.root_grad;
    } else {
      BufferPool::Lease lease = grad_pool_->acquire(ctx_.stream());
      u.grad_slot = lease.slot;
      full = lease.buffer.narrow(0, 0, u.plan->padded_numel);
    }
    ops::fill(ctx_, full, 0.0);
    u.grad_full = full;
    bind_grads(u, full);
  } else if (u.grad_full.defined() && !u.grad_full.shares_storage(u.grad_accum)) {
    // Separate per-micro-batch gradients (exact mode): start from zero each micro-batch.
    ops::fill(ctx_, u.grad_full, 0.0);
  }
}

void ShardedModel::on_post_backward(int unit, autograd::Graph&) {
  reduce_unit(unit);
  if (zero3()) release_gathered(unit);
}

// ---------------------------------------------------------------- gathering (ZeRO-3)

void ShardedModel::issue_gather(int unit, bool prefetch) {
  Unit& u = *units_[size_t(unit)];
  if (u.gather_issued) return;
  // An optimizer update still running (CPU offload overlapped): the unit's new shard.
  Event updated;
  if (weights_fence_) {
    const auto [first, last] = unit_ranges_[size_t(unit)];
    if (first < last && !weights_fence_(first, last, !prefetch, &updated)) return;
  }
  Tensor full;
  if (is_root(unit)) {
    // The root's own buffer: the previous micro-batch's backward may still be reading it.
    full = u.root_gathered;
    gather_stream_.wait(u.released);
  } else {
    BufferPool::Lease lease = gather_pool_->acquire(gather_stream_);
    u.gather_slot = lease.slot;
    full = lease.buffer.narrow(0, 0, u.plan->padded_numel);
  }
  u.compute_full = full;
  // The shard is written by the optimizer on the compute stream.
  gather_stream_.wait(params_updated_);
  gather_stream_.wait(updated);
  if (!communicates(groups_.shard_gather)) {
    StreamScope scope(ctx_, gather_stream_);
    // One rank: its shard is the whole. Several under skip_collectives (the benchmark's
    // compute baseline): every rank's place gets this rank's shard, so the weights hold real
    // values; half-zero weights would draw less power and run faster than training does.
    for (int r = 0; r < groups_.shard_size(); ++r)
      ops::copy(ctx_, full.narrow(0, u.plan->shard_begin(r), u.plan->shard_numel), u.compute_shard);
  } else {
    const Event t0 = timing_start(gather_stream_);
    groups_.shard_gather->all_gather(full, u.compute_shard, gather_stream_);
    timing_end(t0, gather_stream_, 0, full.nbytes());
    issued_.all_gathers++;
  }
  u.gathered = mark(gather_stream_);
  u.gather_issued = true;
}

void ShardedModel::wait_gathered(int unit) {
  Unit& u = *units_[size_t(unit)];
  if (u.bound) return;
  FSDP_ASSERT(u.gather_issued, "unit ", u.name, " used before its weights were gathered");
  ctx_.stream().wait(u.gathered);
  bind_weights(u, u.compute_full);
  u.bound = true;
}

void ShardedModel::release_gathered(int unit) {
  Unit& u = *units_[size_t(unit)];
  if (!u.gather_issued) return;
  if (u.gather_slot >= 0) {
    // The compute stream's queued work (this unit's ops) is the slot's last reader.
    gather_pool_->release(u.gather_slot, ctx_.stream());
    u.gather_slot = -1;
    u.compute_full = Tensor();
  } else {
    u.released = mark(ctx_.stream());
  }
  unbind_weights(u);
  u.bound = false;
  u.gather_issued = false;
}

void ShardedModel::prefetch_from(int unit, int direction) {
  // Position of `unit` among the blocks (the root precedes block 0 in forward and follows
  // the last block in backward).
  int pos;
  if (is_root(unit))
    pos = direction > 0 ? -1 : int(blocks_.size());
  else
    pos = int(std::find(blocks_.begin(), blocks_.end(), unit) - blocks_.begin());
  for (int k = 1; k <= options_.prefetch_units; ++k) {
    const int p = pos + direction * k;
    if (p < 0 || p >= int(blocks_.size())) break;
    issue_gather(blocks_[size_t(p)], /*prefetch=*/true);
  }
}

// ---------------------------------------------------------------- gradient reduction

void ShardedModel::reduce_unit(int unit) {
  Unit& u = *units_[size_t(unit)];
  const UnitPlan& p = *u.plan;
  const ReduceOp op = options_.average_in_collective ? ReduceOp::Avg : ReduceOp::Sum;
  const int n_shard = groups_.shard_size(), n_rep = groups_.replicate_size();
  const bool shard_comm = communicates(groups_.shard_reduce);
  const bool rep_comm = communicates(groups_.replicate);
  const int64_t my_begin = p.shard_begin(groups_.shard_rank());
  double shard_prescale = options_.average_in_collective ? 1.0 : 1.0 / n_shard;
  const double rep_prescale = options_.average_in_collective ? 1.0 : 1.0 / n_rep;
  // nccl_ub: the shard group's reductions are plain sums and 1/dp is applied after them
  // (NCCL's symmetric kernels take sum and avg only, not a pre-multiplied sum; our own
  // scaling costs nothing where an accumulation follows anyway).
  ReduceOp shard_op = op;
  double shard_after = 1.0;
  if (registered_memory()) {
    shard_op = ReduceOp::Sum;
    shard_prescale = 1.0;
    shard_after = 1.0 / n_shard;
  }

  // The reductions run on the reduce stream once this unit's gradients are final.
  reduce_stream_.wait(mark(ctx_.stream()));
  StreamScope scope(ctx_, reduce_stream_);

  if (grads_sharded()) {
    // ZeRO-2/3: reduce-scatter this micro-batch's full gradients and add them to the shard.
    Tensor src = u.grad_full;
    if (options_.grad_dtype != options_.reduce_dtype) {
      if (reduce_in_.defined()) {
        // Registered staging, reused in this stream's order by every unit.
        src = reduce_in_.narrow(0, 0, p.padded_numel);
        ops::copy(ctx_, src, u.grad_full);
      } else {
        src = ops::cast(ctx_, src, options_.reduce_dtype);
      }
    }
    if (!shard_comm) {
      ops::axpby(ctx_, u.grad_accum, 1.0, src.narrow(0, my_begin, p.shard_numel), 1.0);
    } else {
      Tensor part = reduce_out_.defined() ? reduce_out_.narrow(0, 0, p.shard_numel)
                                          : ctx_.empty(Shape{p.shard_numel}, options_.reduce_dtype);
      const Event t0 = timing_start(reduce_stream_);
      groups_.shard_reduce->reduce_scatter(part, src, shard_op, reduce_stream_, shard_prescale);
      timing_end(t0, reduce_stream_, 1, src.nbytes());
      issued_.reduce_scatters++;
      ops::axpby(ctx_, u.grad_accum, shard_after, part, 1.0);
    }
    if (last_micro_batch_ && rep_comm) {
      const Event t0 = timing_start(reduce_stream_);
      groups_.replicate->all_reduce(u.grad_accum, op, reduce_stream_, rep_prescale);
      timing_end(t0, reduce_stream_, 2, u.grad_accum.nbytes());
      issued_.all_reduces++;
    }
    // The full-gradient buffer is free once the reduce stream has read it.
    if (u.grad_slot >= 0) {
      grad_pool_->release(u.grad_slot, reduce_stream_);
      u.grad_slot = -1;
    }
    unbind_grads(u);
    u.grad_full = Tensor();
    return;
  }

  // no_shard / ZeRO-1: full gradients accumulate over micro-batches; reduce on the last.
  if (!u.grad_full.shares_storage(u.grad_accum)) ops::axpby(ctx_, u.grad_accum, 1.0, u.grad_full, 1.0);
  if (!last_micro_batch_) return;
  if (options_.strategy == ShardingStrategy::NoShard) {
    if (rep_comm) {
      const Event t0 = timing_start(reduce_stream_);
      groups_.replicate->all_reduce(u.grad_accum, op, reduce_stream_, rep_prescale);
      timing_end(t0, reduce_stream_, 2, u.grad_accum.nbytes());
      issued_.all_reduces++;
    }
    return;
  }
  // ZeRO-1: one reduce-scatter of the accumulated gradients into the gradient shard.
  if (!shard_comm) {
    ops::copy(ctx_, u.grad_shard, u.grad_accum.narrow(0, my_begin, p.shard_numel));
  } else {
    const Event t0 = timing_start(reduce_stream_);
    groups_.shard_reduce->reduce_scatter(u.grad_shard, u.grad_accum, shard_op, reduce_stream_,
                                         shard_prescale);
    timing_end(t0, reduce_stream_, 1, u.grad_accum.nbytes());
    issued_.reduce_scatters++;
    if (shard_after != 1.0) ops::scale(ctx_, u.grad_shard, u.grad_shard, shard_after);
  }
  if (rep_comm) {
    const Event t0 = timing_start(reduce_stream_);
    groups_.replicate->all_reduce(u.grad_shard, op, reduce_stream_, rep_prescale);
    timing_end(t0, reduce_stream_, 2, u.grad_shard.nbytes());
    issued_.all_reduces++;
  }
}

// ---------------------------------------------------------------- the step

void ShardedModel::start_step() {
  issued_ = Issued();
  micro_batches_ = 0;
  for (auto& up : units_) {
    ops::fill(ctx_, up->grad_accum, 0.0);
    if (up->grad_full.defined() && !up->grad_full.shares_storage(up->grad_accum))
      ops::fill(ctx_, up->grad_full, 0.0);
  }
  // Reductions of this step add into the buffers just zeroed on the compute stream.
  reduce_stream_.wait(mark(ctx_.stream()));
}

void ShardedModel::start_micro_batch(bool last) {
  last_micro_batch_ = last;
  micro_batches_++;
}

void ShardedModel::finish_grad_sync() { ctx_.stream().wait(mark(reduce_stream_)); }

double ShardedModel::grad_multiplier() const {
  // Every collective already averaged over the ranks (pre-multiplied or Avg); what is left
  // is the mean over this rank's micro-batches.
  return 1.0 / std::max(micro_batches_, 1);
}

double ShardedModel::grad_norm() {
  // Per-block sums of squares, gathered in rank order: the global list of blocks is the
  // same for any data-parallel size, and it is summed in one fixed order.
  const int64_t block = options_.shard_block;
  const int n = groups_.shard_size();
  std::vector<Tensor> ordered;
  for (auto& up : units_) {
    Tensor partials = ops::block_sum_squares(ctx_, up->grad_shard, block);
    if (communicates(groups_.shard_gather)) {
      Tensor all = ctx_.empty(Shape{partials.numel() * n}, partials.dtype());
      groups_.shard_gather->all_gather(all, partials, ctx_.stream());
      partials = all;
    }
    ordered.push_back(partials);
  }
  // Each unit's total on the device, all read back in one transfer (one wait for the
  // device, not one per unit), then added on the host in unit order.
  // (f64 holds every unit's total exactly, whatever dtype the sum came in.)
  Tensor totals = ctx_.empty(Shape{int64_t(ordered.size())}, DType::f64);
  for (size_t i = 0; i < ordered.size(); ++i)
    ops::copy(ctx_, totals.narrow(0, int64_t(i), 1), ops::sum(ctx_, ordered[i]));
  double sum = 0;
  for (double v : ops::to_vector<double>(ctx_, totals)) sum += v;
  return std::sqrt(sum) * grad_multiplier();
}

void ShardedModel::install_weights() {
  params_updated_ = mark(ctx_.stream());
  if (zero3() || options_.strategy == ShardingStrategy::NoShard) return;
  // ZeRO-1/2: every rank updated its slice of the full compute weights; gather the rest in
  // place, and let each unit's forward wait for its own gather only.
  gather_stream_.wait(params_updated_);
  for (auto& up : units_) {
    Unit& u = *up;
    if (communicates(groups_.shard_gather)) {
      const Event t0 = timing_start(gather_stream_);
      groups_.shard_gather->all_gather(u.compute_full, u.compute_shard, gather_stream_);
      timing_end(t0, gather_stream_, 0, u.compute_full.nbytes());
      issued_.all_gathers++;
    }
    u.gathered = mark(gather_stream_);
    u.gather_issued = true;
    u.bound = false;
  }
}

// ---------------------------------------------------------------- collective timing

Event ShardedModel::timing_start(const Stream& stream) {
  if (!options_.time_collectives || !ctx_.is_cuda()) return Event();
  Event e = Event::create(ctx_.device(), /*enable_timing=*/true);
  e.record(stream);
  return e;
}

void ShardedModel::timing_end(const Event& start, const Stream& stream, int kind, int64_t bytes) {
  if (!start.recorded()) return;
  Event end = Event::create(ctx_.device(), /*enable_timing=*/true);
  end.record(stream);
  timed_.push_back(TimedSpan{kind, bytes, start, end});
}

CollectiveTimes ShardedModel::take_collective_times() {
  CollectiveTimes t;
  for (const TimedSpan& s : timed_) {
    CollectiveTime& c = s.kind == 0 ? t.all_gather : s.kind == 1 ? t.reduce_scatter : t.all_reduce;
    s.end.synchronize();
    c.count++;
    c.bytes += s.bytes;
    c.ms += Event::elapsed_ms(s.start, s.end);
  }
  timed_.clear();
  return t;
}

}  // namespace fsdp
