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
  // A gather codec: before anything is gathered, wire shards older than the weights are
  // written again.
  if (codec_)
    hooks_.emplace_back(&model_, model_.add_hook(nn::HookPoint::PreForward,
                                                 [this](nn::Module&, autograd::Graph& g) {
                                                   if (!g.recomputing()) encode_weights();
                                                 }));
  for (auto& up : units_) {
    FsdpUnit* u = up.get();
    if (u->plan().companion()) continue;  // its block's unit hands it the events
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

void ShardedModel::start_step() {
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
  if (micro_batches_ == 1 && codec_) {
    encode_weights();
    codec_->first_micro_batch(shared_.ctx);
  }
}

void ShardedModel::encode_weights() {
  if (!codec_ || !wire_stale_) return;
  if (!codec_attached_) {
    std::vector<EncodedUnit> encoded;
    for (auto& u : units_) {
      if (!u->plan().encoded()) continue;
      EncodedUnit e{u->index(), u->params(), u->segments(), u->compute_shard, u->wire_shard, {}};
      if (shared_.communicates(u->groups().shard_gather))
        e.whole_parameter_groups.push_back(u->groups().shard_gather);
      for (Communicator* c : split_groups(u->index()))
        if (shared_.communicates(c)) e.whole_parameter_groups.push_back(c);
      encoded.push_back(std::move(e));
    }
    codec_->attach(shared_.ctx, std::move(encoded));
    codec_attached_ = true;
  }
  codec_->encode(shared_.calls, shared_.ctx);
  // The gathers read the new wire shards.
  shared_.params_updated = Event::at_end_of(shared_.ctx.stream());
  wire_stale_ = false;
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
  wire_stale_ = true;  // (encoded again before the next gather)
  if (shared_.zero3() || shared_.options.strategy == ShardingStrategy::NoShard) return;
  // ZeRO-1/2: every rank updated its slice of the full compute weights; gather the rest in
  // place, and let each unit's forward wait for its own gather only.
  shared_.gather_stream.wait(shared_.params_updated);
  for (auto& u : units_) u->install();
}

}  // namespace fsdp
