// train.cuda_graphs: one micro-batch's forward and backward captured once as a CUDA graph and
// replayed for later micro-batches, so the host issues one launch instead of hundreds.
//
// What has to hold for a replay to equal an eager run, and how each point is met:
// - Addresses. A graph replays with the addresses it was captured with. Its inputs are static
//   token buffers that each micro-batch's tokens are copied into before the launch; its
//   activations and temporaries come from a private memory pool of the device allocator
//   (CudaCachingAllocator::create_pool), reserved before capture from an allocation trace of
//   an eager warm-up micro-batch: no cudaMalloc while capturing, and no block of the pool is
//   ever handed to other work while the graph lives. Its outputs are the loss (a pool block
//   kept by this object; checked to be the only one that escapes) and the parameter
//   gradients (persistent flat buffers of the ShardedModel).
// - No host synchronization while capturing (cudaStreamCaptureModeThreadLocal turns any into
//   an error, reported as such): the trainer passes n_valid, so cross_entropy reads nothing
//   back; the backward seed's value is known on the host; the allocator neither queries
//   events nor calls the system while a pool is in use.
// - Lazily created state (cuBLASLt workspace and plans, cuDNN handle and plans, kernel
//   attributes) is created by the eager warm-up micro-batch, before capture. cuBLASLt runs
//   with one fixed workspace per stream (kernels/cuda/matmul.cu refuses to create one inside a
//   capture); cuDNN attention takes its workspace from the allocator at each call, which while
//   capturing is the graph's pool: the same block, at the same address, in every replay.
//   Given a workspace, neither library allocates device memory itself.
// - Host-side state that would freeze in a replay: there is no dropout or other random op in
//   the models (nothing to advance per micro-batch); activation recompute keeps its
//   bookkeeping per autograd graph, so re-running it once at capture records its kernels;
//   the step and micro-batch counters (ShardedModel::start_micro_batch, the world's step)
//   stay on the host, outside the graph. FSDP: only no_shard is supported (recipe_checks.cc
//   refuses the rest): its weights stay bound to persistent buffers and its hooks queue
//   device work only (zeroing, accumulation on the reduce stream), the same every
//   micro-batch. Collectives are never captured: with several data-parallel ranks the last
//   micro-batch of each step, whose backward all-reduces the gradients, runs eagerly, and
//   so the collective watchdog and the collective timing see every collective as before.
// - Streams. The graph is launched on the compute stream; the reduce stream's work inside it
//   (gradient accumulation) forks from and joins back into the capture. Before capture and
//   before every launch the compute stream waits for the side streams (join_side_streams),
//   so eager work queued there earlier is ordered before the replay.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

// Which micro-batches run how: a host-only value type (tested on the CPU).
class CudaGraphPlan {
 public:
  enum class Action {
    Eager,    // plain eager forward + backward
    WarmUp,   // eager, tracing its allocations: the first micro-batch of the graphed kind
    Capture,  // capture the graph, then launch it: the second one
    Replay,   // launch the captured graph
  };

  // Graphs off: every micro-batch eager.
  CudaGraphPlan() = default;
  // The plan for a run of `recipe` with `dp_size` data-parallel ranks and `accum`
  // micro-batches per rank per step; `communicates`: the gradient all-reduce really runs
  // (dp_size > 1 and collectives are not skipped). Throws ConfigError naming
  // train.cuda_graphs (and the key to change) when graphs cannot be used for this run.
  static CudaGraphPlan of(const Recipe& recipe, int dp_size, int64_t accum, bool communicates);

  bool enabled() const { return enabled_; }
  // Whether the last micro-batch of a step is replayed too (no collective in it).
  bool graphs_last() const { return graphs_last_; }
  // The action for the next micro-batch (`last`: the last of its step); advances the plan.
  Action next(bool last);

 private:
  bool enabled_ = false;
  bool graphs_last_ = false;
  int64_t graphed_seen_ = 0;  // micro-batches of the graphed kind so far
};

const char* action_name(CudaGraphPlan::Action a);

// The captured micro-batch and everything it owns: the executable graph, its static token
// buffers and loss, its private memory pool. Owned by the trainer; CUDA contexts only.
class MicroBatchGraph {
 public:
  // One micro-batch's forward and backward on (idx, tgt); returns the loss (one element).
  using Body = std::function<Tensor(const Tensor& idx, const Tensor& tgt)>;

  // join_side_streams: makes the context's current stream wait for every side stream the
  // body forks work onto (ShardedModel::finish_grad_sync).
  MicroBatchGraph(Context& ctx, CudaGraphPlan plan, std::function<void()> join_side_streams);
  ~MicroBatchGraph();
  MicroBatchGraph(const MicroBatchGraph&) = delete;
  MicroBatchGraph& operator=(const MicroBatchGraph&) = delete;

  // Runs the next micro-batch as the plan says: body(idx, tgt) eagerly, or the graph. A
  // replay's loss is the graph's static output: read it (queue work on the stream) before
  // the next micro-batch overwrites it.
  Tensor run(bool last, const Tensor& idx, const Tensor& tgt, const Body& body);

  const CudaGraphPlan& plan() const { return plan_; }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }  // graph launches, the capturing one included

 private:
  struct Impl;
  Tensor warm_up(const Tensor& idx, const Tensor& tgt, const Body& body);
  Tensor capture(const Tensor& idx, const Tensor& tgt, const Body& body);
  Tensor launch(const Tensor& idx, const Tensor& tgt);

  Context& ctx_;
  CudaGraphPlan plan_;
  std::function<void()> join_side_streams_;
  std::unique_ptr<Impl> impl_;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace fsdp::train
