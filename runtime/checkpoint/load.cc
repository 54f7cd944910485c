#include "runtime/checkpoint/load.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "kernels/ops.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/rank_agreement.h"
#include "runtime/checkpoint/shard_state.h"

namespace fsdp::checkpoint {
namespace {

// The state kinds to read from the checkpoint; the others start fresh (zero moments).
std::vector<std::string> kinds_to_read(const CheckpointMetadata& m, const Optimizer* optimizer,
                                       const std::string& dir) {
  if (!optimizer) return {kMainWeights};
  const std::string ours = optimizer_kind_name(optimizer->config().kind);
  if (m.optimizer == "none" || m.optimizer_steps == 0) {
    if (m.optimizer == ours && ours != "sgd") return m.state_kinds();
    return {kMainWeights};  // nothing learned yet: fresh optimizer state
  }
  FSDP_CHECK(m.optimizer == ours, CheckpointError, dir, ": the checkpoint's optimizer is ",
             m.optimizer, " (after ", m.optimizer_steps, " steps) but this run's is ", ours,
             "; its state cannot be carried over");
  return m.state_kinds();
}

// The model's buffers that the checkpoint holds (the others keep their values): each of
// the model's shape; a checkpoint after training steps must hold every one.
std::vector<const ModelBuffer*> buffers_to_read(const CheckpointMetadata& m,
                                                const std::vector<ModelBuffer>& buffers,
                                                const std::string& dir) {
  std::vector<const ModelBuffer*> out;
  for (const ModelBuffer& b : buffers) {
    const BufferRecord* r = m.find_buffer(b.name);
    FSDP_CHECK(r != nullptr || m.step == 0 || b.optional, CheckpointError, dir, " holds no buffer \"", b.name,
               "\" of the model, but ", m.step, " steps of training that moved it (saved by a run "
               "without it, or by a build whose checkpoints did not hold buffers): resuming would "
               "restart it and leave the run's curve");
    if (!r) continue;
    FSDP_CHECK(r->shape == b.tensor.shape(), CheckpointError, dir, " does not fit this model: buffer \"",
               b.name, "\" is ", r->shape, " in the checkpoint but ", b.tensor.shape(), " in the model",
               b.shape_key.empty() ? std::string() : " (its shape follows '" + b.shape_key + "')");
    out.push_back(&b);
  }
  return out;
}

// Host buffers for the state of every unit of this rank, in the checkpoint's dtypes, and
// of the model's buffers.
struct Staged {
  std::vector<std::map<std::string, Tensor>> units;
  std::vector<Tensor> buffers;  // as buffers_to_read() lists them
};

Staged read_shards(Context& ctx, CheckpointReader& reader, ShardedModel& model,
                   const std::vector<std::string>& kinds) {
  Staged staged;
  for (int unit = 0; unit < model.num_units(); ++unit) {
    const UnitPlan& u = model.plan().units()[size_t(unit)];
    // An experts unit's shard is of the expert-data-parallel group.
    const int shard_rank = model.unit_groups(unit).shard_rank();
    std::map<std::string, Tensor> state;
    for (const std::string& kind : kinds) {
      Tensor host = ctx.empty_host(Shape{u.shard_numel}, reader.metadata().dtype_of_kind(kind));
      // Alignment gaps and padding hold no parameter: zeros, as in a fresh model.
      if (host.numel()) std::memset(host.data_ptr(), 0, host.nbytes());
      char* base = host.numel() ? static_cast<char*>(host.data_ptr()) : nullptr;
      for (const ShardSegment& s : u.segments(shard_rank)) {
        const std::string& name = u.params[size_t(s.param)].name;
        const nn::Parameter* param = model.model().find_parameter(name);
        if (!param || !param->parallel_slice()) {
          reader.read(kind, name, s.param_offset, s.numel,
                      base + size_t(s.shard_offset) * host.element_size());
          continue;
        }
        // A tensor-parallel slice or an expert-parallel rank's experts: its local elements by
        // their place in the whole parameter.
        for (const nn::ParallelSlice::Run& r : param->parallel_slice()->runs(s.param_offset, s.numel))
          reader.read(kind, name, r.full, r.numel,
                      base + size_t(s.shard_offset + r.local - s.param_offset) * host.element_size());
      }
      state[kind] = host;
    }
    staged.units.push_back(std::move(state));
  }
  return staged;
}

}  // namespace

void check_model_matches(const CheckpointMetadata& m, const ShardingPlan& plan, nn::Module& model,
                         const std::string& dir) {
  std::set<std::string> ours;
  for (const UnitPlan& u : plan.units()) {
    for (const ParamPlacement& p : u.params) {
      // The whole parameter's shape: a tensor-parallel slice reads its part of it.
      const nn::Parameter* param = model.find_parameter(p.name);
      const Shape shape = param ? param->full_shape() : p.shape;
      ours.insert(p.name);
      const ParamRecord* r = m.find_param(p.name);
      FSDP_CHECK(r != nullptr, CheckpointError, dir, " does not fit this model: parameter \"", p.name,
                 "\" ", shape, " of the model is not in the checkpoint (a different model?)");
      FSDP_CHECK(r->shape == shape, CheckpointError, dir, " does not fit this model: parameter \"",
                 p.name, "\" is ", r->shape, " in the checkpoint but ", shape, " in the model");
    }
  }
  for (const ParamRecord& r : m.params)
    FSDP_CHECK(ours.count(r.name), CheckpointError, dir, " does not fit this model: the checkpoint holds "
               "parameter \"", r.name, "\" ", r.shape, ", which the model does not have (a different model?)");
}

CheckpointMetadata load_checkpoint(Context& ctx, Communicator* comm, ShardedModel& model,
                                   Optimizer* optimizer, const std::string& dir,
                                   const LoadOptions& options) {
  const int rank = comm ? comm->rank() : 0;
  const int world_size = comm ? comm->size() : 1;
  const ShardState state(model, optimizer);
  std::unique_ptr<CheckpointReader> reader;
  std::vector<std::string> kinds;
  std::vector<const ModelBuffer*> buffers;

  // 1. The metadata, the model's fit, the optimizer's, and the files' presence.
  run_on_every_rank(ctx, comm, [&] {
    reader = std::make_unique<CheckpointReader>(dir);
    check_model_matches(reader->metadata(), model.plan(), model.model(), dir);
    kinds = kinds_to_read(reader->metadata(), optimizer, dir);
    buffers = buffers_to_read(reader->metadata(), options.buffers, dir);
    reader->check_files_present();
  });
  // 2. Checksums: each file by one rank.
  run_on_every_rank(ctx, comm, [&] {
    if (!options.verify_checksums) return;
    for (size_t i = 0; i < reader->metadata().files.size(); ++i)
      if (int(i % size_t(world_size)) == rank) reader->verify_file(i);
  });
  // 3. This rank's shards, staged on the host.
  Staged staged;
  run_on_every_rank(ctx, comm, [&] {
    staged = read_shards(ctx, *reader, model, kinds);
    for (const ModelBuffer* b : buffers) staged.buffers.push_back(reader->read_buffer(ctx, b->name));
  });

  // 4. Every rank has everything it needs: install it.
  for (int u = 0; u < model.num_units(); ++u) {
    for (const std::string& kind : state.kinds()) {
      auto it = staged.units[size_t(u)].find(kind);
      if (it != staged.units[size_t(u)].end()) {
        state.from_host(ctx, u, kind, it->second);
      } else {
        Tensor zeros = ctx.empty_host(Shape{state.shard_numel(u)}, state.dtype(kind));
        if (zeros.numel()) std::memset(zeros.data_ptr(), 0, zeros.nbytes());
        state.from_host(ctx, u, kind, zeros);
      }
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i) ops::copy(ctx, buffers[i]->tensor, staged.buffers[i]);
  const CheckpointMetadata& m = reader->metadata();
  // The step count goes with the state it was counted for (bias correction of the moments).
  if (optimizer) optimizer->set_steps_taken(optimizer_kind_name(optimizer->config().kind) == m.optimizer ? m.optimizer_steps : 0);
  model.refresh_compute_weights();
  ctx.synchronize();
  return m;
}

}  // namespace fsdp::checkpoint
