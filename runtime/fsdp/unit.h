// FsdpUnit: one unit of a sharded model (a group of transformer blocks, or the root: every
// parameter outside the blocks), with its buffers and an explicit life. Its weights are in
// one of three states:
//
//   sharded    only this rank's shard is present (ZeRO-3, between uses)
//   gathering  an all-gather of the full weights is queued on the gather stream (ZeRO-3:
//              unshard(); ZeRO-1/2: install() after an optimizer step)
//   gathered   the full weights are present and the parameters point into them
//
//   sharded --unshard()--> gathering --wait_for_unshard()--> gathered --reshard()--> sharded
//
// no_shard, ZeRO-1 and ZeRO-2 keep the full weights, so their units stay gathered (ZeRO-1/2
// pass through gathering after each update). The module hooks call the event methods:
//
//   pre_forward    unshard (ZeRO-3), wait, prefetch the next units' gathers
//   post_forward   reshard (ZeRO-3), unless backward needs the weights next (the root, the
//                  last block)
//   pre_backward   unshard again and wait (ZeRO-3), prefetch the previous units' gathers; a
//                  fresh full-gradient buffer (ZeRO-2/3) or a zeroed one (separate dtypes)
//   post_backward  reduce the gradients (one of the two reduction paths), reshard (ZeRO-3)
//
// Private to runtime/fsdp: the ShardedModel builds the units, lays out their buffers and
// attaches the hooks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/autograd/graph.h"
#include "runtime/core/context.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/buffer_pool.h"
#include "collectives/collective_calls.h"
#include "runtime/fsdp/options.h"
#include "runtime/fsdp/plan.h"
#include "runtime/nn/module.h"

namespace fsdp {

// The groups a sharded model communicates over. shard_gather / shard_reduce: the group the
// state is sharded across (two communicators of one group; null when it has one rank).
// replicate: the group the sharded state is replicated across and whose gradients are
// all-reduced (HSDP's dp_outer; every data-parallel rank for no_shard; null when none).
struct DataParallelGroups {
  Communicator* shard_gather = nullptr;
  Communicator* shard_reduce = nullptr;
  Communicator* replicate = nullptr;
  // The group whose ranks hold the other slices of sliced parameters (nn::ParallelSlice),
  // or null. FSDP never communicates over it; checkpoints number their files by it.
  Communicator* slices = nullptr;
  // Parameters whose parts differ within the data-parallel group
  // (nn::Placement::parts_within_data_parallel) are sharded and replicated over the ranks
  // holding the same part instead: the part groups (null when of one rank). `parts` is the
  // group of the ranks holding the other parts, or null; `part_name` names their units.
  Communicator* part_shard_gather = nullptr;
  Communicator* part_shard_reduce = nullptr;
  Communicator* part_replicate = nullptr;
  Communicator* parts = nullptr;
  std::string part_name = "parts";
  int parts_size() const { return parts ? parts->size() : 1; }
  // The groups of a part unit: the part groups in the places of the shard and replicate
  // groups.
  DataParallelGroups part_groups() const {
    DataParallelGroups g = *this;
    g.shard_gather = part_shard_gather;
    g.shard_reduce = part_shard_reduce;
    g.replicate = part_replicate;
    return g;
  }
  int shard_size() const { return shard_gather ? shard_gather->size() : 1; }
  int shard_rank() const { return shard_gather ? shard_gather->rank() : 0; }
  int replicate_size() const { return replicate ? replicate->size() : 1; }
};

// Asked before a ZeRO-3 gather whether the new compute weights of optimizer ranges
// [first, last) are on their way (block: wait until they are; false: they are not, and a
// prefetch skips the gather), and for the event after which they are on the device
// (ShardedModel::set_weights_fence).
using WeightsFence = std::function<bool(size_t first, size_t last, bool block, Event* ready)>;

// Where a step stands. Until start_micro_batch says otherwise a backward reduces its
// gradients fully, as the step's last micro-batch does.
enum class StepPhase : uint8_t {
  accumulating,      // a micro-batch before the step's last: ZeRO-1/no_shard only accumulate
  last_micro_batch,  // the step's last (or only) micro-batch: everything is reduced
  grads_finished,    // finish_grad_sync ran the step's once-per-step gradient work
};

// What the units of one sharded model share.
struct UnitShared {
  UnitShared(Context& ctx, const FsdpOptions& options, const DataParallelGroups& groups);

  Context& ctx;
  FsdpOptions options;
  DataParallelGroups groups;
  DataParallelGroups part_groups;  // groups.part_groups(): what part units use
  Stream gather_stream, reduce_stream;  // the compute stream when overlap is off
  std::unique_ptr<BufferPool> gather_pool, grad_pool;  // ZeRO-3 weights; ZeRO-2/3 gradients
  CollectiveCalls calls;
  Event params_updated;  // compute stream, after the latest write of the compute shards
  WeightsFence weights_fence;
  StepPhase phase = StepPhase::last_micro_batch;
  // nccl_ub, ZeRO-2/3: the persistent reduce-scatter output (and input of the reduce dtype
  // when the gradients are cast first), reused by every unit in the reduce stream's order.
  Tensor reduce_out, reduce_in;

  // Whether this micro-batch's backward reduces what is accumulated (over every group).
  bool reduces_fully() const { return phase != StepPhase::accumulating; }
  bool zero3() const { return options.strategy == ShardingStrategy::OptimGradsParams; }
  bool grads_sharded() const {
    return options.strategy == ShardingStrategy::OptimGrads || zero3();
  }
  // Whether collectives over `c` really run (a group of one, or skip_collectives: no).
  bool communicates(const Communicator* c) const { return calls.communicates(c); }
  // Whether the shard group's buffers are registrable (nccl_ub with more than one shard;
  // never with part units, which span two groups).
  bool registered_memory() const {
    return options.nccl_ub && groups.shard_size() > 1 && !groups.parts;
  }
};

class FsdpUnit {
 public:
  enum class State : uint8_t { sharded, gathering, gathered };

  // `params` aligned with plan.params; `modules`: the unit's blocks in forward order, or the
  // model for the root. Starts sharded; the ShardedModel sets the buffers next.
  FsdpUnit(UnitShared& shared, int index, const UnitPlan& plan, std::vector<nn::Module*> modules,
           std::vector<nn::Parameter*> params, bool is_root);

  // The units whose gathers this one issues ahead in forward and in backward (prefetch), and
  // whether its full weights outlive its forward when backward follows (the root: a tied
  // embedding is used at both ends; the last block: its backward comes next).
  void set_neighbours(std::vector<FsdpUnit*> forward_prefetch,
                      std::vector<FsdpUnit*> backward_prefetch, bool keep_for_backward);
  // A block's part unit (plan().part, sharded over other groups) or encoded unit
  // (plan().encoded(), gathered through the gather codec): it has no hooks of its own but
  // follows this unit through every event, its full weights and gradients in the tail of
  // this unit's pool slots, after those of the companions added before it.
  void add_companion(FsdpUnit* companion);
  const std::vector<FsdpUnit*>& companions() const { return companions_; }
  // Elements of the compute dtype its gathered weights take in a pool slot: padded_numel,
  // or for an encoded unit its wire bytes.
  int64_t gathered_numel() const;

  // ---- events of a micro-batch (the module hooks call these)
  void pre_forward(const autograd::Graph& g);
  void post_forward(const autograd::Graph& g);
  void pre_backward();
  void post_backward();

  // ---- weights
  // Queues the all-gather of the full weights (ZeRO-3; sharded -> gathering). A prefetch
  // does not wait for an optimizer update still running (the weights fence) and then
  // leaves the unit sharded.
  // `slot`: where the full weights go (a companion's part of its block's slot); undefined:
  // a slot of the pool (the root: its own buffer).
  void unshard(bool prefetch = false, const Tensor& slot = Tensor());
  // The compute stream waits for the gather; the parameters point at the full weights
  // (gathering -> gathered).
  void wait_for_unshard();
  // Gives the full weights back (ZeRO-3; -> sharded). The compute stream's queued work is
  // their last reader.
  void reshard();
  // ZeRO-1/2 after an optimizer step: all-gather the updated shards into the full weights
  // (-> gathering). (ZeRO-3 gathers at the next use; no_shard updated everything.)
  void install();
  // Full weights that were gathered as they are (non-ZeRO-3 set-up): the parameters point
  // into `full` (-> gathered).
  void adopt_full_weights(const Tensor& full);

  // ---- gradients
  void zero_grads();  // start of a step: the accumulation (and separate full gradients)
  // Points the parameters' gradients into `full` (backward writes there).
  void bind_grads(const Tensor& full);

  // ---- identity and buffers (laid out by the ShardedModel)
  // The groups this unit is sharded and replicated over (the part groups for a part
  // unit), its rank in the shard group and the group's size.
  const DataParallelGroups& groups() const { return plan_.part ? s_.part_groups : s_.groups; }
  int shard_rank() const { return groups().shard_rank(); }
  int shard_size() const { return groups().shard_size(); }
  int index() const { return index_; }
  const std::string& name() const { return plan_.name; }
  const UnitPlan& plan() const { return plan_; }
  // This rank's pieces of the unit's parameters (plan().segments(shard_rank())).
  const std::vector<ShardSegment>& segments() const { return segments_; }
  bool is_root() const { return is_root_; }
  State state() const { return state_; }
  const std::vector<nn::Module*>& modules() const { return modules_; }
  const std::vector<nn::Parameter*>& params() const { return params_; }
  void drop_param_views();  // parameters point at nothing (the sharded model's end)

  Tensor compute_full;   // full compute weights: persistent unless ZeRO-3
  Tensor compute_shard;  // this rank's compute weights (a view of compute_full unless ZeRO-3)
  Tensor main;           // this rank's master weights
  Tensor grad_full;      // full gradients written by backward (persistent: no_shard, optim)
  Tensor grad_accum;     // accumulated gradients (full: no_shard/optim; shard: ZeRO-2/3)
  Tensor grad_shard;     // the reduced gradient the optimizer reads
  Tensor root_gathered;  // ZeRO-3 root: gathered weights, held from forward to backward
  Tensor root_grad;      // ZeRO-2/3 root: full gradients, held through the backward
  // An encoded unit (ZeRO-3): this rank's wire shard (shard_numel * wire_element_size u8,
  // written by the gather codec from compute_shard after each update; what the all-gather
  // sends).
  Tensor wire_shard;
  size_t first_range = 0, end_range = 0;  // this unit's optimizer ranges

 private:
  // The two reduction paths, run on the reduce stream when the unit's backward is done.
  void reduce_grads();
  void reduce_sharded_grads();  // ZeRO-2/3: reduce-scatter each micro-batch into the shard
  void reduce_full_grads();     // no_shard / ZeRO-1: accumulate; reduce on the last micro-batch
  void bind_weights(const Tensor& full);
  void unbind_weights();
  void unbind_grads();
  // Queues the all-gather into `slot` (or a pool slot); false when a prefetch finds the
  // unit's new weights not yet on their way (the weights fence).
  bool start_gather(bool prefetch, const Tensor& slot);
  // Before a micro-batch's backward: ZeRO-2/3 a fresh full-gradient buffer (`slot`: a
  // companion's part of its block's slot), otherwise zeroed separate gradients.
  void prepare_grads(const Tensor& slot);
  // Companion k's part of a slot this unit leased (gathered weights, or full gradients):
  // after this unit's own and those of the companions before it.
  Tensor companion_slot(const BufferPool::Lease& lease, size_t k, bool weights) const;

  UnitShared& s_;
  int index_;
  const UnitPlan& plan_;
  std::vector<ShardSegment> segments_;
  std::vector<nn::Module*> modules_;
  std::vector<nn::Parameter*> params_;
  bool is_root_;
  std::vector<FsdpUnit*> forward_prefetch_, backward_prefetch_;
  bool keep_for_backward_ = false;
  std::vector<FsdpUnit*> companions_;

  State state_ = State::sharded;
  Event gathered_;              // gather stream, after the gather
  Event released_;              // compute stream, after the last use of root_gathered
  BufferPool::Lease gather_lease_;  // pool slot of the gathered weights (ZeRO-3 blocks)
  BufferPool::Lease grad_lease_;    // pool slot of the full gradients (ZeRO-2/3 blocks)
  // The root: the reduce stream's last read of root_grad, which the next micro-batch's
  // backward zeroes and reuses.
  Event root_grad_reduced_;
};

}  // namespace fsdp
