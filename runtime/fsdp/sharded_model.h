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
#include "collectives/mesh.h"
#include "runtime/autograd/graph.h"
#include "runtime/core/context.h"
#include "runtime/fsdp/buffer_pool.h"
#include "runtime/fsdp/plan.h"
#include "runtime/nn/module.h"
#include "runtime/optim/optimizer.h"

namespace fsdp {

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  DType compute_dtype = DType::f32;  // the weights ops read (bf16 on GPU)
  DType main_dtype = DType::f32;     // master weights the optimizer updates
  DType grad_dtype = DType::f32;     // what backward accumulates into
  DType reduce_dtype = DType::f32;   // reductions and the persistent gradient accumulation
  // Divide by the data-parallel size inside the collective (Avg) rather than pre-multiplying
  // the inputs by 1/dp.
  bool average_in_collective = false;
  int prefetch_units = 1;                          // all-gathers issued ahead of use
  int64_t max_inflight_reduce_bytes = 256 << 20;  // full-gradient buffers awaiting reduction
  std::string unit_kind = "block";
  // Consecutive blocks per unit: a unit's weights are gathered and its gradients reduced as
  // one collective each (the bucket), so more blocks per unit means fewer, larger messages
  // and more memory held gathered.
  int blocks_per_unit = 1;
  int64_t shard_block = 4096;  // shard granularity in elements (see plan.h)
  uint64_t seed = 1234;        // parameter initialization
  // Side streams (CUDA) for all-gathers and for reductions; false: that kind of collective
  // runs on the compute stream, in order with compute.
  bool overlap_gather = true;
  bool overlap_reduce = true;
  // Benchmarks only: replace every collective by a local copy of the same buffers, so a
  // run times compute and optimizer alone (the results are then not those of training).
  bool skip_collectives = false;
  // CPU offload (optimizer.cpu_offload; CUDA): the master weights live in page-locked host
  // memory, so the optimizer (given host ranges) updates them on the host; the device keeps
  // the compute weights and gradients only.
  bool offload_main = false;
  // Benchmarks: time every collective of the step with CUDA events on its stream (from the
  // moment its stream reaches it until it ends: waiting for the peers included).
  bool time_collectives = false;
  // NCCL user-buffer registration (ddp.nccl_ub). With a shard group of more than one rank,
  // every buffer the shard group's collectives read or write is allocated registrable
  // (collectives/comm_memory.h: ncclMemAlloc on a GPU, outside the caching allocator) and
  // registered with its communicator as `nccl_ub_kind`: the compute weights, the gathered
  // weights (pool slots and the root's buffer) with the gather communicator; the full
  // gradients (pool slots, the root's buffer; ZeRO-1's accumulation and shard) and a
  // persistent reduce-scatter output (plus an input of the reduce dtype when gradients are
  // cast first) with the reduce communicator. Reduce-scatters then sum in the collective and
  // apply 1/dp in the accumulation that follows, since NCCL's symmetric kernels take no
  // pre-multiplied sum (same values; bitwise the same when dp is a power of two). Where the
  // backend registers nothing (MPI) the same buffers and schedule run unregistered.
  bool nccl_ub = false;
  BufferRegistration nccl_ub_kind = BufferRegistration::symmetric;
};

// What the collectives of one step took on the device (FsdpOptions::time_collectives).
struct CollectiveTime {
  int64_t count = 0;
  int64_t bytes = 0;  // per rank: the full (gathered or reduced) buffer's size
  double ms = 0;      // summed over the collectives of the kind
};
struct CollectiveTimes {
  CollectiveTime all_gather, reduce_scatter, all_reduce;
};

// The groups a sharded model communicates over. shard_gather / shard_reduce: the group the
// state is sharded across (two communicators of one group; null when it has one rank).
// replicate: the group the sharded state is replicated across and whose gradients are
// all-reduced (HSDP's dp_outer; every data-parallel rank for no_shard; null when none).
struct DataParallelGroups {
  Communicator* shard_gather = nullptr;
  Communicator* shard_reduce = nullptr;
  Communicator* replicate = nullptr;
  int shard_size() const { return shard_gather ? shard_gather->size() : 1; }
  int shard_rank() const { return shard_gather ? shard_gather->rank() : 0; }
  int replicate_size() const { return replicate ? replicate->size() : 1; }
};

// The groups a strategy uses on a mesh: the ZeRO strategies shard over dp_shard and
// replicate over dp_outer (HSDP when dp_outer > 1); no_shard replicates over all of dp.
DataParallelGroups data_parallel_groups(MeshCommunicators& comms, ShardingStrategy strategy);

// Bytes per buffer class on this rank (see memory_report()).
struct MemoryBreakdown {
  size_t compute_weights = 0;   // persistent compute weights (shards, or full copies)
  size_t main_weights = 0;
  size_t grad_accumulation = 0; // persistent gradients (shards, or full copies)
  size_t full_grads = 0;        // persistent full-size gradient buffers (no_shard, optim)
  size_t gather_pool = 0;       // gathered-weight slots + the root's gathered buffer
  size_t grad_pool = 0;         // full-gradient slots awaiting reduction
  size_t host_main_weights = 0; // master weights in host memory (offload_main; not in total())
  size_t total() const {
    return compute_weights + main_weights + grad_accumulation + full_grads + gather_pool +
           grad_pool;
  }
};

class ShardedModel {
 public:
  ShardedModel(Context& ctx, nn::Module& model, const DataParallelGroups& groups,
               const FsdpOptions& options);
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  const ShardingPlan& plan() const { return plan_; }
  const FsdpOptions& options() const { return options_; }
  nn::Module& model() { return model_; }

  // ---- one optimizer step
  void start_step();                        // zeroes gradient accumulation
  void start_micro_batch(bool last);        // last: reduce what is accumulated
  void finish_grad_sync();                  // compute stream waits for every reduction
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
  using WeightsFence = std::function<bool(size_t first, size_t last, bool block, Event* ready)>;
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
  // laid out as main_shard(u)), summed over the shard group: element [k] belongs to the
  // k-th parameter in plan order (unit by unit). Collective over the shard group.
  std::vector<double> param_sums_of_squares(const std::vector<Tensor>& shards);
  // Writes unit u's full compute weights into `out` (padded_numel; gathers if sharded).
  void gather_full_weights(int unit, const Tensor& out);
  int num_units() const { return int(units_.size()); }
  int shard_rank() const { return groups_.shard_rank(); }
  int shard_size() const { return groups_.shard_size(); }

  // ---- reports
  MemoryBreakdown memory() const { return memory_; }
  std::string memory_report() const;

  // Collectives issued since start_step() (for tests of the schedule).
  struct Issued {
    int64_t all_gathers = 0, reduce_scatters = 0, all_reduces = 0;
  };
  const Issued& issued() const { return issued_; }
  // The timed collectives since the last call (FsdpOptions::time_collectives), summed by
  // kind. Call once the device has finished them (after the step's loss was read).
  CollectiveTimes take_collective_times();

 private:
  struct Unit;
  void build_plan();
  void allocate();
  // nccl_ub: registers every collective buffer with its communicator (see FsdpOptions).
  void register_buffers(const Tensor& compute, const Tensor& grad_accum, const Tensor& grad_shard);
  // Whether the shard group's buffers are registrable (nccl_ub with more than one shard).
  bool registered_memory() const { return options_.nccl_ub && groups_.shard_size() > 1; }
  void initialize_weights();
  void attach_hooks();
  void bind_weights(Unit& u, const Tensor& full);
  void unbind_weights(Unit& u);
  void bind_grads(Unit& u, const Tensor& full);
  void unbind_grads(Unit& u);

  // ZeRO-3 gathering. A prefetch returns without gathering when the unit's weights are not
  // updated yet (the weights fence), rather than hold the host up.
  void issue_gather(int unit, bool prefetch = false);
  void wait_gathered(int unit);
  void release_gathered(int unit);
  void prefetch_from(int unit, int direction);
  // Hooks.
  void on_pre_forward(int unit, autograd::Graph& g);
  void on_post_forward(int unit, autograd::Graph& g);
  void on_pre_backward(int unit, autograd::Graph& g);
  void on_post_backward(int unit, autograd::Graph& g);
  void reduce_unit(int unit);
  // Collective timing: an event on `stream` before a collective (undefined when off), and
  // the span it opened, closed after the collective was issued on the same stream.
  Event timing_start(const Stream& stream);
  void timing_end(const Event& start, const Stream& stream, int kind, int64_t bytes);

  bool zero3() const { return options_.strategy == ShardingStrategy::OptimGradsParams; }
  bool grads_sharded() const {
    return options_.strategy == ShardingStrategy::OptimGrads || zero3();
  }
  bool is_root(int unit) const { return unit == root_; }
  // Whether collectives over `c` really run (a group of one, or skip_collectives: no).
  bool communicates(const Communicator* c) const {
    return c && c->size() > 1 && !options_.skip_collectives;
  }

  Context& ctx_;
  nn::Module& model_;
  DataParallelGroups groups_;
  FsdpOptions options_;
  ShardingPlan plan_;
  std::vector<std::unique_ptr<Unit>> units_;  // blocks in forward order, then the root
  int root_ = -1;
  std::vector<int> blocks_;  // unit indices of the blocks, in forward order
  Stream gather_stream_, reduce_stream_;
  Event params_updated_;  // compute stream, after the latest write of the compute shards
  std::unique_ptr<BufferPool> gather_pool_, grad_pool_;
  std::vector<OptimizerRange> optimizer_ranges_;
  std::vector<std::pair<size_t, size_t>> unit_ranges_;  // per unit: [first, last) ranges
  WeightsFence weights_fence_;
  MemoryBreakdown memory_;
  bool last_micro_batch_ = true;
  int micro_batches_ = 0;
  Issued issued_;
  struct TimedSpan {
    int kind;  // 0 all-gather, 1 reduce-scatter, 2 all-reduce
    int64_t bytes;
    Event start, end;
  };
  std::vector<TimedSpan> timed_;
  std::vector<std::pair<nn::Module*, nn::HookId>> hooks_;
  // nccl_ub: the reduce-scatter output (and, when gradients are cast before the reduction,
  // its input) as persistent registered buffers; reused by every unit in the reduce
  // stream's order.
  Tensor reduce_out_, reduce_in_;
  // Last: deregistered before any buffer they cover can be freed.
  std::vector<Registration> registrations_;
};

// Builds a ShardedModel (the public entry point, in the manner of PyTorch's fully_shard).
std::unique_ptr<ShardedModel> fully_shard(Context& ctx, nn::Module& model,
                                          const DataParallelGroups& groups,
                                          const FsdpOptions& options);

}  // namespace fsdp
