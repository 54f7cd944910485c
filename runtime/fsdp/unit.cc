#include "runtime/fsdp/unit.h"

#include <utility>

#include "kernels/ops.h"
#include "runtime/fsdp/buffer_layout.h"
#include "runtime/fsdp/gather_codec.h"

namespace fsdp {
UnitShared::UnitShared(Context& c, const FsdpOptions& o, const DataParallelGroups& g)
    : ctx(c), options(o), groups(g), part_groups(g.part_groups()), calls(c, o.time_collectives, o.skip_collectives) {
  // Collectives on their own streams (high priority: scheduled ahead of compute when both
  // are ready), unless overlap is turned off for that kind.
  gather_stream = c.is_cuda() && o.overlap_gather ? Stream::create_cuda(c.device().index, -1)
                                                  : c.compute_stream();
  reduce_stream = c.is_cuda() && o.overlap_reduce ? Stream::create_cuda(c.device().index, -1)
                                                  : c.compute_stream();
}

FsdpUnit::FsdpUnit(UnitShared& shared, int index, const UnitPlan& plan,
                   std::vector<nn::Module*> modules, std::vector<nn::Parameter*> params,
                   bool is_root)
    : s_(shared), index_(index), plan_(plan), modules_(std::move(modules)),
      params_(std::move(params)), is_root_(is_root) {
  segments_ = plan_.segments(shard_rank());
}

void FsdpUnit::set_neighbours(std::vector<FsdpUnit*> forward_prefetch,
                              std::vector<FsdpUnit*> backward_prefetch, bool keep_for_backward) {
  forward_prefetch_ = std::move(forward_prefetch);
  backward_prefetch_ = std::move(backward_prefetch);
  keep_for_backward_ = keep_for_backward;
}

void FsdpUnit::add_companion(FsdpUnit* companion) {
  FSDP_ASSERT(companion && companion->plan().companion() && !plan_.companion() && !is_root_,
              "a part or encoded unit follows a block's unit");
  companions_.push_back(companion);
}

int64_t FsdpUnit::gathered_numel() const {
  return fsdp::gathered_numel(plan_, s_.options.compute_dtype);
}

// ---------------------------------------------------------------- events

void FsdpUnit::pre_forward(const autograd::Graph& g) {
  if (g.recomputing()) {
    // The recomputed forward runs inside backward: pre_backward gathered the weights.
    wait_for_unshard();
    return;
  }
  if (s_.zero3()) unshard();
  wait_for_unshard();
  if (s_.zero3())
    for (FsdpUnit* next : forward_prefetch_) next->unshard(/*prefetch=*/true);
}

void FsdpUnit::post_forward(const autograd::Graph& g) {
  if (!s_.zero3() || g.recomputing()) return;
  if (keep_for_backward_ && g.grad_enabled()) return;
  reshard();
}

void FsdpUnit::pre_backward() {
  if (s_.zero3()) {
    unshard();
    wait_for_unshard();
    for (FsdpUnit* previous : backward_prefetch_) previous->unshard(/*prefetch=*/true);
  }
  prepare_grads(Tensor());
}

void FsdpUnit::prepare_grads(const Tensor& slot) {
  if (s_.grads_sharded()) {
    // A fresh full-gradient buffer for this micro-batch's backward of the unit.
    Tensor full;
    if (is_root_) {
      // The root's is the same buffer every micro-batch: zeroed only once the reduce stream
      // has read the last one's (a pool slot's reuse waits inside the pool).
      s_.ctx.stream().wait(root_grad_reduced_);
      full = root_grad;
    } else if (slot.defined()) {
      full = slot;
    } else {
      grad_lease_ = s_.grad_pool->acquire(s_.ctx.stream());
      full = grad_lease_.buffer.narrow(0, 0, plan_.padded_numel);
    }
    ops::fill(s_.ctx, full, 0.0);
    grad_full = full;
    bind_grads(full);
  } else if (grad_full.defined() && !grad_full.shares_storage(grad_accum)) {
    // Separate per-micro-batch gradients (another dtype than the accumulation): start from
    // zero each micro-batch.
    ops::fill(s_.ctx, grad_full, 0.0);
  }
  for (size_t k = 0; k < companions_.size(); ++k)
    companions_[k]->prepare_grads(grad_lease_.slot >= 0 ? companion_slot(grad_lease_, k, false)
                                                        : Tensor());
}

void FsdpUnit::post_backward() {
  // The companions' reductions are queued first: this unit's releases the slot they share.
  for (FsdpUnit* c : companions_) c->reduce_grads();
  reduce_grads();
  if (s_.zero3()) reshard();
}

Tensor FsdpUnit::companion_slot(const BufferPool::Lease& lease, size_t k, bool weights) const {
  auto size = [weights](const FsdpUnit& u) { return weights ? u.gathered_numel() : u.plan().padded_numel; };
  int64_t offset = size(*this);
  for (size_t i = 0; i < k; ++i) offset += size(*companions_[i]);
  return lease.buffer.narrow(0, offset, size(*companions_[k]));
}

// ---------------------------------------------------------------- weights

void FsdpUnit::unshard(bool prefetch, const Tensor& slot) {
  if (state_ == State::sharded && !start_gather(prefetch, slot)) return;
  if (gather_lease_.slot < 0) return;
  for (size_t k = 0; k < companions_.size(); ++k)
    companions_[k]->unshard(prefetch, companion_slot(gather_lease_, k, true));
}

bool FsdpUnit::start_gather(bool prefetch, const Tensor& slot) {
  // An optimizer update still running (CPU offload overlapped): this unit's new shard.
  Event updated;
  if (s_.weights_fence && first_range < end_range &&
      !s_.weights_fence(first_range, end_range, !prefetch, &updated))
    return false;
  Tensor full;
  if (is_root_) {
    // The root's own buffer: the previous micro-batch's backward may still be reading it.
    full = root_gathered;
    s_.gather_stream.wait(released_);
  } else if (slot.defined()) {
    full = slot;
  } else {
    gather_lease_ = s_.gather_pool->acquire(s_.gather_stream);
    full = gather_lease_.buffer.narrow(0, 0, plan_.padded_numel);
  }
  compute_full = full;
  // The shard is written by the optimizer on the compute stream.
  s_.gather_stream.wait(s_.params_updated);
  s_.gather_stream.wait(updated);
  // An encoded unit sends and receives its wire bytes.
  const Tensor dst = plan_.encoded()
                         ? full.as_bytes().narrow(0, 0, plan_.padded_numel * plan_.wire_element_size)
                         : full;
  const Tensor src = plan_.encoded() ? wire_shard : compute_shard;
  if (!s_.communicates(groups().shard_gather)) {
    StreamScope scope(s_.ctx, s_.gather_stream);
    // One rank: its shard is the whole. Several under skip_collectives (the benchmark's
    // compute baseline): every rank's place gets this rank's shard, so the weights hold real
    // values; half-zero weights would draw less power and run faster than training does.
    for (int r = 0; r < shard_size(); ++r)
      ops::copy(s_.ctx, dst.narrow(0, r * src.numel(), src.numel()), src);
  } else {
    s_.calls.all_gather(*groups().shard_gather, dst, src, s_.gather_stream);
  }
  gathered_ = Event::at_end_of(s_.gather_stream);
  state_ = State::gathering;
  return true;
}

void FsdpUnit::wait_for_unshard() {
  for (FsdpUnit* c : companions_) c->wait_for_unshard();
  if (state_ == State::gathered) return;
  FSDP_ASSERT(state_ == State::gathering, "unit ", name(), " used before its weights were gathered");
  s_.ctx.stream().wait(gathered_);
  bind_weights(compute_full);
  state_ = State::gathered;
}

void FsdpUnit::reshard() {
  // The companions first: their weights lie in this unit's slot.
  for (FsdpUnit* c : companions_) c->reshard();
  if (state_ == State::sharded) return;
  if (gather_lease_.slot >= 0) {
    // The compute stream's queued work (this unit's ops) is the slot's last reader.
    s_.gather_pool->release(gather_lease_.slot, s_.ctx.stream());
    gather_lease_ = BufferPool::Lease();
    compute_full = Tensor();
  } else if (is_root_) {
    released_ = Event::at_end_of(s_.ctx.stream());
  } else {
    compute_full = Tensor();  // a companion's part of its block's slot
  }
  unbind_weights();
  state_ = State::sharded;
}

void FsdpUnit::install() {
  if (s_.communicates(groups().shard_gather))
    s_.calls.all_gather(*groups().shard_gather, compute_full, compute_shard, s_.gather_stream);
  gathered_ = Event::at_end_of(s_.gather_stream);
  state_ = State::gathering;
}

void FsdpUnit::adopt_full_weights(const Tensor& full) {
  compute_full = full;
  bind_weights(full);
  state_ = State::gathered;
}

void FsdpUnit::bind_weights(const Tensor& full) {
  if (plan_.encoded()) {
    // The layers read the codec's form of the weights; there is no data.
    const Tensor bytes = full.as_bytes();
    const int64_t w = plan_.wire_element_size;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamPlacement& pp = plan_.params[i];
      s_.options.gather_codec->bind(index_, i, *params_[i], bytes.narrow(0, pp.offset * w, pp.numel * w));
    }
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamPlacement& pp = plan_.params[i];
    params_[i]->data = full.narrow(0, pp.offset, pp.numel).view(pp.shape);
  }
}

void FsdpUnit::unbind_weights() {
  for (nn::Parameter* p : params_) {
    p->data = Tensor();
    if (plan_.encoded()) s_.options.gather_codec->unbind(*p);
  }
}

void FsdpUnit::drop_param_views() {
  unbind_weights();
  for (nn::Parameter* p : params_) p->grad = Tensor();
}

// ---------------------------------------------------------------- gradients

void FsdpUnit::zero_grads() {
  ops::fill(s_.ctx, grad_accum, 0.0);
  if (grad_full.defined() && !grad_full.shares_storage(grad_accum)) ops::fill(s_.ctx, grad_full, 0.0);
}

void FsdpUnit::bind_grads(const Tensor& full) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamPlacement& pp = plan_.params[i];
    params_[i]->grad = full.narrow(0, pp.offset, pp.numel).view(pp.shape);
  }
}

void FsdpUnit::unbind_grads() {
  for (nn::Parameter* p : params_) p->grad = Tensor();
}

void FsdpUnit::reduce_grads() {
  // The reductions run on the reduce stream once this unit's gradients are final.
  s_.reduce_stream.wait(Event::at_end_of(s_.ctx.stream()));
  StreamScope scope(s_.ctx, s_.reduce_stream);
  if (s_.grads_sharded())
    reduce_sharded_grads();
  else
    reduce_full_grads();
  if (is_root_) root_grad_reduced_ = Event::at_end_of(s_.reduce_stream);
}

namespace {

// How a reduction over a group of n ranks averages: inside the collective (Avg), by a
// prescale of 1/n on the inputs, or (nccl_ub's shard group, whose symmetric kernels take no
// pre-multiplied sum) by 1/n applied after a plain sum.
struct Averaging {
  ReduceOp op;
  double prescale;
  double after;
};
Averaging averaging(const FsdpOptions& o, int n, bool registered) {
  if (registered) return {ReduceOp::Sum, 1.0, 1.0 / n};
  if (o.average_in_collective) return {ReduceOp::Avg, 1.0, 1.0};
  return {ReduceOp::Sum, 1.0 / n, 1.0};
}

}  // namespace

void FsdpUnit::reduce_sharded_grads() {
  const Averaging shard = averaging(s_.options, shard_size(), s_.registered_memory());
  const Averaging rep = averaging(s_.options, groups().replicate_size(), false);
  // This micro-batch's full gradients, in the reduce dtype.
  Tensor src = grad_full;
  if (s_.options.grad_dtype != s_.options.reduce_dtype) {
    if (s_.reduce_in.defined()) {
      src = s_.reduce_in.narrow(0, 0, plan_.padded_numel);
      ops::copy(s_.ctx, src, grad_full);
    } else {
      src = ops::cast(s_.ctx, src, s_.options.reduce_dtype);
    }
  }
  if (!s_.communicates(groups().shard_reduce)) {
    const int64_t mine = plan_.shard_begin(shard_rank());
    ops::axpby(s_.ctx, grad_accum, 1.0, src.narrow(0, mine, plan_.shard_numel), 1.0);
  } else {
    Tensor part = s_.reduce_out.defined()
                      ? s_.reduce_out.narrow(0, 0, plan_.shard_numel)
                      : s_.ctx.empty(Shape{plan_.shard_numel}, s_.options.reduce_dtype);
    s_.calls.reduce_scatter(*groups().shard_reduce, part, src, shard.op, s_.reduce_stream,
                            shard.prescale);
    ops::axpby(s_.ctx, grad_accum, shard.after, part, 1.0);
  }
  if (s_.reduces_fully() && s_.communicates(groups().replicate))
    s_.calls.all_reduce(*groups().replicate, grad_accum, rep.op, s_.reduce_stream, rep.prescale);
  // The full-gradient buffer is free once the reduce stream has read it.
  if (grad_lease_.slot >= 0) {
    s_.grad_pool->release(grad_lease_.slot, s_.reduce_stream);
    grad_lease_ = BufferPool::Lease();
  }
  unbind_grads();
  grad_full = Tensor();
}

void FsdpUnit::reduce_full_grads() {
  if (!grad_full.shares_storage(grad_accum)) ops::axpby(s_.ctx, grad_accum, 1.0, grad_full, 1.0);
  if (!s_.reduces_fully()) return;
  const Averaging shard = averaging(s_.options, shard_size(), s_.registered_memory());
  const Averaging rep = averaging(s_.options, groups().replicate_size(), false);
  const bool replicated = s_.communicates(groups().replicate);
  if (s_.options.strategy == ShardingStrategy::NoShard) {
    if (replicated)
      s_.calls.all_reduce(*groups().replicate, grad_accum, rep.op, s_.reduce_stream, rep.prescale);
    return;
  }
  // ZeRO-1: one reduce-scatter of the accumulated gradients into the gradient shard.
  if (!s_.communicates(groups().shard_reduce)) {
    const int64_t mine = plan_.shard_begin(shard_rank());
    ops::copy(s_.ctx, grad_shard, grad_accum.narrow(0, mine, plan_.shard_numel));
  } else {
    s_.calls.reduce_scatter(*groups().shard_reduce, grad_shard, grad_accum, shard.op,
                            s_.reduce_stream, shard.prescale);
    if (shard.after != 1.0) ops::scale(s_.ctx, grad_shard, grad_shard, shard.after);
  }
  if (replicated)
    s_.calls.all_reduce(*groups().replicate, grad_shard, rep.op, s_.reduce_stream, rep.prescale);
}

}  // namespace fsdp
