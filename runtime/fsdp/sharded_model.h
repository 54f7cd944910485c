// ShardedModel: a model with Fully Sharded Data Parallel applied from outside, per unit.
//
//   auto sharded = fully_shard(ctx, model, groups, options);   // plans, allocates shards,
//                                                               // initializes them, hooks in
//   for each step:
//     sharded->start_step();
//     for each micro-batch m:
//       sharded->start_micro_batch(m == last);
//       loss = model.forward(graph, x, y);  graph.backward(loss);   // hooks gather/reduce
//     sharded->finish_grad_sync();
//     double norm = sharded->grad_norm();
//     optimizer.step(lr, sharded->grad_multiplier() * clip);  // over optimizer_ranges()
//     sharded->install_weights();
//
// The model never mentions sharding. Units are the modules of kind options.unit_kind
// ("block": the transformer blocks), in forward order; every other parameter belongs to the
// root unit (embeddings, final norm, head), which stays gathered from its forward to the end
// of its backward (a tied embedding is used at both ends), each micro-batch. Each
// unit's parameters live in flat buffers laid out by the ShardingPlan; Parameter::data and
// Parameter::grad are views into them, so nothing is copied around the collectives.
//
// Which buffers are sharded depends on the strategy:
//                        compute weights   gradients              main weights + Adam
//   no_shard (DDP)       full              full, all-reduced      full (every rank updates all)
//   optim (ZeRO-1)       full              full, reduce-scattered sharded
//                                          on the last micro-batch
//   optim_grads (ZeRO-2) full              sharded, reduce-scattered every micro-batch
//   optim_grads_params   sharded; each unit gathered before its forward and again before
//   (ZeRO-3)             its backward, freed after use
//
// Streams (CUDA): all-gathers run on their own stream and communicator, reduce-scatters on
// another; the compute stream waits for a gather only when it needs the weights. In forward
// each unit's pre-forward hook issues the gathers of the next `prefetch_units` units; in
// backward, of the previous ones; the last forward unit is not resharded before backward.
// On the CPU the same code runs with inline streams.
//
// Exactness on the CPU: with f32 compute, each micro-batch's gradients are computed in f32
// and accumulated and reduced in f64 (reduce_dtype), in which these sums are exact, and the
// gradient norm is summed per fixed-size block; so the loss sequence of any strategy and
// data-parallel size equals a single process's, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/autograd/graph.h"
#include "runtime/core/context.h"
#include "runtime/fsdp/buffer_layout.h"
#include "runtime/fsdp/buffer_pool.h"
#include "runtime/fsdp/gather_codec.h"
#include "runtime/fsdp/grad_sync_hook.h"
#include "runtime/fsdp/options.h"
#include "runtime/fsdp/plan.h"
#include "runtime/fsdp/unit.h"
#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"

namespace fsdp {

// (The groups of a device mesh: runtime/parallel/data_parallel_groups.h.)

class ShardedModel {
 public:
  ShardedModel(Context& ctx, nn::Module& model, const DataParallelGroups& groups,
               const FsdpOptions& options);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  const ShardingPlan& plan() const { return plan_; }
  const FsdpOptions& options() const { return shared_.options; }
  nn::Module& model() { return model_; }

  // What a parallelism that splits parameters over other ranks adds to the gradients and
  // norms (grad_sync_hook.h). Hooks run in the order they were added.
  void add_grad_sync_hook(std::unique_ptr<GradSyncHook> hook);

  // ---- one optimizer step
  void start_step();                        // zeroes gradient accumulation
  void start_micro_batch(bool last);        // last: reduce what is accumulated
  // The compute stream waits for every reduction; after the last micro-batch, each grad
  // sync hook's after_reduction runs on every unit, once per step.
  void finish_grad_sync();
  // True gradient = accumulated gradient * grad_multiplier(): 1 / (micro-batches over all
  // data-parallel ranks), folded with the collectives' scaling.
  double grad_multiplier() const;
  // The global L2 norm of the true gradient (synchronizes with the device).
  double grad_norm();
  // This rank's optimizer ranges: one per weight-decay range of each unit's shard (master
  // weights, reduced gradient, compute weights to refresh).
  const std::vector<OptimizerRange>& optimizer_ranges() const { return optimizer_ranges_; }
  // After the optimizer wrote the new compute weights (OptimizerRange::param_copy): makes
  // them visible to the next forward (ZeRO-1/2: all-gather the updated shards).
  void install_weights();

  // The optimizer ranges in the order the next forward needs them (the root's first, then
  // the blocks'): an update that runs while the next forward does (CPU offload overlapped)
  // goes in this order.
  std::vector<size_t> forward_range_order() const;
  // ZeRO-3 with an update still running when the next forward starts: before gathering a
  // unit, `fence(first, last, block, &ready)` is asked whether the new compute weights of
  // optimizer ranges [first, last) are on their way (block: wait until they are; a prefetch
  // does not wait) and for the event after which they are on the device. Null: none.
  void set_weights_fence(WeightsFence fence);

  // After the master weights were written from outside (a checkpoint load): rewrites the
  // compute weights from them and installs those (as after an optimizer step).
  void refresh_compute_weights();

  // ---- state access (checkpoints, tests)
  // This rank's shard of unit u's master weights / compute weights (views).
  Tensor main_shard(int unit) const;
  Tensor compute_shard(int unit) const;
  int64_t main_offset(int unit) const;  // first element of the flat buffer main_shard covers
  // The sum of squares of every parameter's elements in `shards` (one tensor per unit,
  // laid out as main_shard(u)), summed over the unit's shard group and its hooks' split
  // groups (the whole parameter's sum; runs a hook marks uncounted count on another rank):
  // element [k] belongs to the k-th parameter in plan order (unit by unit). Collective over
  // those groups.
  std::vector<double> param_sums_of_squares(const std::vector<Tensor>& shards);
  // Writes unit u's full compute weights into `out` (padded_numel; gathers if sharded).
  void gather_full_weights(int unit, const Tensor& out);
  int num_units() const { return int(units_.size()); }
  int shard_rank() const { return shared_.groups.shard_rank(); }
  int shard_size() const { return shared_.groups.shard_size(); }
  // The groups unit u is sharded and replicated over: a part unit's are the part groups
  // (DataParallelGroups::part_groups()), whose shard rank and size differ from the above.
  const DataParallelGroups& unit_groups(int u) const { return unit(u).groups(); }

  // ---- reports
  MemoryBreakdown memory() const { return memory_; }
  std::string memory_report() const;

  // The path every step-time collective takes (the optimizer's exchanges too), counted and
  // timed; and the collectives issued on it since start_step() (for tests of the schedule).
  CollectiveCalls& collective_calls() { return shared_.calls; }
  const IssuedCollectives& issued() const { return shared_.calls.issued(); }
  // The timed collectives since the last call (FsdpOptions::time_collectives), summed by
  // kind. Call once the device has finished them (after the step's loss was read).
  CollectiveTimes take_collective_times() { return shared_.calls.take_times(); }

 private:
  void build_units();
  void check_plan_across_ranks();
  // The buffers: one arena per persistent class (buffer_layout.h), each unit's views into
  // them and its optimizer ranges, then the pools; allocate() does all three.
  struct Arenas {
    PersistentLayout layout;
    Tensor main, compute, grad_accum, grad_full, grad_shard;
    Tensor wire;  // encoded units' wire shards (bytes)
  };
  void allocate();
  Arenas allocate_arenas();
  void lay_out_unit(FsdpUnit& u, const Arenas& a);
  void allocate_pools();
  // A zeroed buffer of n elements (registrable memory for nccl_ub), its cost added to `account`.
  Tensor new_buffer(int64_t n, DType dtype, bool registrable, const std::string& what,
                    size_t& account);
  // nccl_ub: registers every collective buffer with its communicator (see FsdpOptions).
  void register_buffers(const Tensor& compute, const Tensor& wire, const Tensor& grad_accum,
                        const Tensor& grad_shard);
  // The gather codec writes the encoded units' wire shards when an update (or a load)
  // changed the weights since the last time: before any forward that gathers them (a model
  // pre-forward hook) and at a step's first micro-batch. The first call attaches the codec
  // to the units (after the grad sync hooks were added: their split groups are the groups
  // a whole parameter lies over).
  void encode_weights();
  void initialize_weights();
  void attach_hooks();
  // Unit u's view for the grad sync hooks, with `shard` (laid out as its shard) as gradients.
  UnitGradients unit_gradients(int u, const Tensor& shard) const;
  // The groups holding the other parts of unit u's parameters (every hook's, in order).
  std::vector<Communicator*> split_groups(int u) const;
  // `shard` (unit u's layout) with the runs the hooks mark uncounted zeroed (a copy; or
  // `shard` itself when there are none).
  Tensor counted(int u, const Tensor& shard);
  // The gradient norm's two exchanges: each unit's block sums gathered over its shard
  // group ((ranks, blocks) per unit; one all-gather per group, packed), and the units'
  // totals ((units) f64) summed in place over their split groups.
  std::vector<Tensor> gather_block_sums(const std::vector<Tensor>& partials);
  void sum_over_split_groups(const Tensor& totals);
  FsdpUnit& unit(int u) { return *units_[size_t(u)]; }
  const FsdpUnit& unit(int u) const { return *units_[size_t(u)]; }

  nn::Module& model_;
  UnitShared shared_;  // context, options, groups, streams, pools, collective calls
  ShardingPlan plan_;
  std::vector<std::unique_ptr<FsdpUnit>> units_;  // blocks in forward order, then the root
  int root_ = -1;
  std::vector<int> blocks_;  // unit indices of the blocks, in forward order
  std::vector<OptimizerRange> optimizer_ranges_;
  MemoryBreakdown memory_;
  int micro_batches_ = 0;  // of the current step (the phase is shared_.phase)
  std::vector<std::unique_ptr<GradSyncHook>> grad_sync_hooks_;
  // The gather codec (null: none), whether it is attached, and whether the wire shards
  // predate the compute shards.
  GatherCodec* codec_ = nullptr;
  bool codec_attached_ = false;
  bool wire_stale_ = true;
  std::vector<std::pair<nn::Module*, nn::HookId>> hooks_;
  // Last: deregistered before any buffer they cover can be freed.
  std::vector<Registration> registrations_;
};

// Builds a ShardedModel (the public entry point, in the manner of PyTorch's fully_shard).
std::unique_ptr<ShardedModel> fully_shard(Context& ctx, nn::Module& model,
                                          const DataParallelGroups& groups,
                                          const FsdpOptions& options);

}  // namespace fsdp
