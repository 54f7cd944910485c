// ShardedModel: the per-step schedule. Module hooks hand each unit its events (unit.h);
// the step functions zero the gradients, finish the reductions, compute the global
// gradient norm and make updated weights visible again.
#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "runtime/fsdp/sharded_model.h"

namespace fsdp {
// ---------------------------------------------------------------- hooks

void ShardedModel::attach_hooks() {
  // A unit of several blocks is gathered before its first block's forward and released after
  // its last's; in backward, gathered (and given fresh gradient buffers) before its last
  // block's backward, reduced after its first's. Every block's forward, recomputed in
  // backward included, waits for the gather.
  // fp8_param: before anything is gathered, FP8 shards older than the weights are redone.
  if (fp8_weight_amax_.defined())
    hooks_.emplace_back(&model_, model_.add_hook(nn::HookPoint::PreForward,
                                                 [this](nn::Module&, autograd::Graph& g) {
                                                   if (!g.recomputing()) quantize_fp8_weights();
                                                 }));
  for (auto& up : units_) {
    FsdpUnit* u = up.get();
    if (u->plan().experts || u->plan().fp8) continue;  // its block's unit hands it the events
    nn::Module* first = u->modules().front();
    nn::Module* last = u->modules().back();
    for (nn::Module* m : u->modules()) {
      const bool is_first = m == first;
      hooks_.emplace_back(m, m->add_hook(nn::HookPoint::PreForward,
                                         [u, is_first](nn::Module&, autograd::Graph& g) {
                                           if (is_first || g.recomputing()) u->pre_forward(g);
                                           else u->wait_for_unshard();
                                         }));
    }
    hooks_.emplace_back(last, last->add_hook(nn::HookPoint::PostForward,
                                             [u](nn::Module&, autograd::Graph& g) { u->post_forward(g); }));
    hooks_.emplace_back(last, last->add_hook(nn::HookPoint::PreBackward,
                                             [u](nn::Module&, autograd::Graph&) { u->pre_backward(); }));
    hooks_.emplace_back(first, first->add_hook(nn::HookPoint::PostBackward,
                                               [u](nn::Module&, autograd::Graph&) { u->post_backward(); }));
  }
}

// ---------------------------------------------------------------- the step

void ShardedModel::clear_fp8_weight_casts() {
  for (nn::Parameter* p : model_.named_parameters()) p->fp8_weight_cast.reset();
}

void ShardedModel::start_step() {
  // A cast made since the update (an evaluation's) is made again, so that the step's
  // first product records the weight's amax under delayed scaling.
  clear_fp8_weight_casts();
  shared_.calls.reset_counts();
  micro_batches_ = 0;
  shared_.phase = StepPhase::last_micro_batch;
  for (auto& u : units_) u->zero_grads();
  // Reductions of this step add into the buffers just zeroed on the compute stream.
  shared_.reduce_stream.wait(Event::at_end_of(shared_.ctx.stream()));
}

void ShardedModel::start_micro_batch(bool last) {
  shared_.phase = last ? StepPhase::last_micro_batch : StepPhase::accumulating;
  micro_batches_++;
  if (micro_batches_ == 1 && fp8_weight_amax_.defined()) {
    quantize_fp8_weights();
    record_fp8_weight_amaxes();
  }
}

void ShardedModel::quantize_fp8_weights() {
  if (!fp8_stale_ || !fp8_weight_amax_.defined()) return;
  Context& ctx = shared_.ctx;
  // Each weight's amax over its pieces on this rank (0 where it has none), then over the
  // shard group: every rank then holds the whole weight's amax.
  ops::fill(ctx, fp8_weight_amax_, 0.0);
  int64_t first = 0;
  for (auto& u : units_) {
    if (!u->plan().fp8) continue;
    for (const ShardSegment& s : u->plan().segments(u->shard_rank()))
      ops::fp8_amax(ctx, fp8_weight_amax_.narrow(0, first + s.param, 1),
                    u->compute_shard.narrow(0, s.shard_offset, s.numel));
    first += int64_t(u->params().size());
  }
  Communicator* group = shared_.groups.shard_gather;
  if (shared_.communicates(group))
    shared_.calls.all_reduce(*group, fp8_weight_amax_, ReduceOp::Max, ctx.stream(), 1.0);
  // Then over the groups holding the weights' other parts (a slice's amax becomes the whole
  // weight's; a weight held whole there is its own maximum over equal copies). Every FP8
  // unit of a rank is split alike, so the first one's groups serve all.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u]->plan().fp8) continue;
    for (Communicator* c : split_groups(int(u)))
      if (shared_.communicates(c))
        shared_.calls.all_reduce(*c, fp8_weight_amax_, ReduceOp::Max, ctx.stream(), 1.0);
    break;
  }
  // The amax each weight is scaled by: its own, or under delayed scaling with a history
  // the history's (as the layer would take it: the same on every rank).
  const Tensor scale_amax = ops::clone(ctx, fp8_weight_amax_);
  first = 0;
  for (auto& u : units_) {
    if (!u->plan().fp8) continue;
    const std::vector<nn::Parameter*>& params = u->params();
    const int64_t n = int64_t(params.size());
    for (int64_t i = 0; i < n; ++i) {
      const nn::Fp8Recipe& r = *params[size_t(i)]->fp8;
      if (r.scaling == nn::Fp8Scaling::delayed && *r.delayed.primed)
        ops::copy(ctx, scale_amax.narrow(0, first + i, 1),
                  r.delayed.scale_amax.narrow(0, int(nn::Fp8Operand::weight), 1));
    }
    // One recipe for every FP8 layer (the plan's), so one format per unit.
    const kernels::Fp8Format format = params.front()->fp8->forward;
    ops::fp8_scale_inverses(ctx, u->fp8_scale_inv, scale_amax.narrow(0, first, n), format);
    for (const ShardSegment& s : u->plan().segments(u->shard_rank()))
      ops::fp8_quantize_flat(ctx, u->fp8_shard.narrow(0, s.shard_offset, s.numel),
                             u->compute_shard.narrow(0, s.shard_offset, s.numel),
                             scale_amax.narrow(0, first + s.param, 1), format);
    first += n;
  }
  // The gathers read the new FP8 shards.
  shared_.params_updated = Event::at_end_of(ctx.stream());
  fp8_stale_ = false;
}

void ShardedModel::record_fp8_weight_amaxes() {
  Context& ctx = shared_.ctx;
  int64_t first = 0;
  for (auto& u : units_) {
    if (!u->plan().fp8) continue;
    for (const nn::Parameter* p : u->params()) {
      const nn::Fp8Recipe& r = *p->fp8;
      // The step's amaxes start at zero, and nothing else records a gathered weight's.
      if (r.scaling == nn::Fp8Scaling::delayed)
        ops::copy(ctx, r.delayed.step_amax.narrow(0, int(nn::Fp8Operand::weight), 1),
                  fp8_weight_amax_.narrow(0, first, 1));
      ++first;
    }
  }
}

void ShardedModel::finish_grad_sync() {
  shared_.ctx.stream().wait(Event::at_end_of(shared_.reduce_stream));
  if (shared_.phase != StepPhase::last_micro_batch) return;
  for (const auto& hook : grad_sync_hooks_)
    for (size_t u = 0; u < units_.size(); ++u)
      hook->after_reduction(unit_gradients(int(u), units_[u]->grad_shard), shared_.calls, shared_.ctx);
  shared_.phase = StepPhase::grads_finished;
}

double ShardedModel::grad_multiplier() const {
  // Every collective already averaged over the ranks (pre-multiplied or Avg); what is left
  // is the mean over this rank's micro-batches.
  return 1.0 / std::max(micro_batches_, 1);
}

void ShardedModel::install_weights() {
  shared_.params_updated = Event::at_end_of(shared_.ctx.stream());
  fp8_stale_ = true;  // (fp8_param: requantized before the next gather)
  clear_fp8_weight_casts();  // (Fp8Recipe::cache_weight: cast again from the new weights)
  if (shared_.zero3() || shared_.options.strategy == ShardingStrategy::NoShard) return;
  // ZeRO-1/2: every rank updated its slice of the full compute weights; gather the rest in
  // place, and let each unit's forward wait for its own gather only.
  shared_.gather_stream.wait(shared_.params_updated);
  for (auto& u : units_) u->install();
}

}  // namespace fsdp
