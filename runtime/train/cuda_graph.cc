#include "runtime/train/cuda_graph.h"

#include <exception>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/allocator.h"
#include "runtime/core/error.h"

#if FSDP_WITH_CUDA
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp::train {

// ---------------------------------------------------------------- the plan

CudaGraphPlan CudaGraphPlan::of(const Recipe& recipe, int dp_size, int64_t accum, bool communicates) {
  CudaGraphPlan plan;
  if (!recipe.train.cuda_graphs) return plan;
  // The recipe checks say the same at load time; repeated here so that the plan stands on
  // its own for callers that build a Recipe by hand.
  FSDP_CHECK(recipe.dist.device == "cuda", ConfigError, "'train.cuda_graphs' is true but the run is on \"",
             recipe.dist.device, "\": CUDA graphs need a GPU (set train.cuda_graphs=false)");
  FSDP_CHECK(recipe.ddp.data_parallel_sharding_strategy == "no_shard", ConfigError,
             "'train.cuda_graphs' supports 'ddp.data_parallel_sharding_strategy' \"no_shard\" only, "
             "not \"", recipe.ddp.data_parallel_sharding_strategy, "\"");
  FSDP_CHECK(accum >= 1 && dp_size >= 1, ConfigError, "'train.cuda_graphs': ", accum,
             " micro-batches per step on ", dp_size, " data-parallel ranks");
  // A micro-batch whose backward launches the gradient all-reduce is never captured: NCCL
  // work inside a graph would also hide it from the collective watchdog and the timing.
  plan.graphs_last_ = !communicates;
  FSDP_CHECK(plan.graphs_last_ || accum >= 2, ConfigError,
             "'train.cuda_graphs' with ", dp_size, " data-parallel ranks replays only the "
             "micro-batches before the last of each step (the last one all-reduces the gradients "
             "in its backward and runs eagerly), but each rank runs 1 micro-batch per step: set "
             "'train.global_batch_size' to a multiple of ", 2 * int64_t(recipe.train.micro_batch_size) * dp_size,
             " ('train.micro_batch_size' x data-parallel size x 2 or more), or train.cuda_graphs=false");
  plan.enabled_ = true;
  return plan;
}

CudaGraphPlan::Action CudaGraphPlan::next(bool last) {
  if (!enabled_ || (last && !graphs_last_)) return Action::Eager;
  const int64_t n = graphed_seen_++;
  if (n == 0) return Action::WarmUp;
  if (n == 1) return Action::Capture;
  return Action::Replay;
}

const char* action_name(CudaGraphPlan::Action a) {
  switch (a) {
    case CudaGraphPlan::Action::Eager: return "eager";
    case CudaGraphPlan::Action::WarmUp: return "warm-up";
    case CudaGraphPlan::Action::Capture: return "capture";
    case CudaGraphPlan::Action::Replay: return "replay";
  }
  return "?";
}

// ---------------------------------------------------------------- the graph

struct MicroBatchGraph::Impl {
  CudaCachingAllocator* alloc = nullptr;
  std::vector<CudaCachingAllocator::PoolDemand> demand;  // traced by the warm-up
  int pool = 0;
  Stream stream;             // the stream captured and launched on
  Tensor idx, tgt, loss;     // static input and output buffers
#if FSDP_WITH_CUDA
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
#endif
};

namespace {

// Ends the pool's use when the capture ends, however it ends.
class PoolUse {
 public:
  PoolUse(CudaCachingAllocator& alloc, int pool) : alloc_(alloc) { alloc.begin_pool_use(pool); }
  ~PoolUse() {
    try {
      alloc_.end_pool_use();
    } catch (...) {
      // Only an inconsistent allocator throws here; the capture's own error is reported.
    }
  }
  PoolUse(const PoolUse&) = delete;
  PoolUse& operator=(const PoolUse&) = delete;

 private:
  CudaCachingAllocator& alloc_;
};

#if FSDP_WITH_CUDA
// Runs a CUDA graph call checked by FSDP_CALL, saying what failed in train.cuda_graphs' terms.
template <typename F>
void graph_step(const char* what, F&& call) {
  try {
    call();
  } catch (const Error& e) {
    FSDP_THROW(CudaError, "train.cuda_graphs: ", what, " failed (set train.cuda_graphs=false to "
               "train without graphs): ", e.what());
  }
}
#endif

}  // namespace

MicroBatchGraph::MicroBatchGraph(Context& ctx, CudaGraphPlan plan, std::function<void()> join_side_streams)
    : ctx_(ctx), plan_(plan), join_side_streams_(std::move(join_side_streams)), impl_(std::make_unique<Impl>()) {
  if (!plan_.enabled()) return;
  FSDP_CHECK(ctx.is_cuda(), ConfigError, "'train.cuda_graphs' needs a CUDA device, but the context is on ",
             ctx.device().str());
  impl_->alloc = dynamic_cast<CudaCachingAllocator*>(ctx.allocator().get());
  FSDP_CHECK(impl_->alloc != nullptr, ConfigError, "'train.cuda_graphs' needs the CUDA caching allocator "
             "(its private pools), but the context's device allocator is '", ctx.allocator()->name(), "'");
}

MicroBatchGraph::~MicroBatchGraph() {
  Impl& m = *impl_;
#if FSDP_WITH_CUDA
  // A launched graph may still run: its memory goes back only after it is done. Destructors
  // cannot report; a failed device is torn down regardless.
  try {
    if (m.exec) m.stream.synchronize();
  } catch (...) {
  }
  if (m.exec) cudaGraphExecDestroy(m.exec);
  if (m.graph) cudaGraphDestroy(m.graph);
#endif
  m.idx = m.tgt = m.loss = Tensor();
  if (m.pool != 0) {
    try {
      m.alloc->destroy_pool(m.pool);
    } catch (...) {
    }
  }
}

Tensor MicroBatchGraph::run(bool last, const Tensor& idx, const Tensor& tgt, const Body& body) {
  switch (plan_.next(last)) {
    case CudaGraphPlan::Action::Eager: return body(idx, tgt);
    case CudaGraphPlan::Action::WarmUp: return warm_up(idx, tgt, body);
    case CudaGraphPlan::Action::Capture: return capture(idx, tgt, body);
    case CudaGraphPlan::Action::Replay: return launch(idx, tgt);
  }
  FSDP_THROW(InternalError, "MicroBatchGraph: unknown action");
}

Tensor MicroBatchGraph::warm_up(const Tensor& idx, const Tensor& tgt, const Body& body) {
  // Eager, but every block it holds at once is counted: the graph's pool is reserved from
  // this trace (the capture allocates the same sizes in the same order).
  impl_->alloc->begin_trace();
  Tensor loss;
  try {
    loss = body(idx, tgt);
  } catch (...) {
    impl_->alloc->end_trace();
    throw;
  }
  impl_->demand = impl_->alloc->end_trace();
  return loss;
}

#if FSDP_WITH_CUDA

Tensor MicroBatchGraph::capture(const Tensor& idx, const Tensor& tgt, const Body& body) {
  Impl& m = *impl_;
  m.stream = ctx_.stream();
  cudaStream_t stream = m.stream.cuda_stream();
  // Static inputs (outside the pool: they are written between replays).
  m.idx = ctx_.empty(idx.shape(), idx.dtype());
  m.tgt = ctx_.empty(tgt.shape(), tgt.dtype());
  ops::copy(ctx_, m.idx, idx);
  ops::copy(ctx_, m.tgt, tgt);
  join_side_streams_();
  m.pool = m.alloc->create_pool(m.demand);
  Tensor loss;
  {
    PoolUse use(*m.alloc, m.pool);
    // Thread-local: a call that cannot be captured (a synchronization, cudaMalloc) fails on
    // this thread; other threads (the collective watchdog, offload workers) are unaffected.
    graph_step("beginning the capture of a micro-batch", [&] {
      FSDP_CALL(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    });
    try {
      loss = body(m.idx, m.tgt);
      // Work forked onto side streams must join the capture before it ends.
      join_side_streams_();
    } catch (const std::exception& e) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);  // the capture is already invalid
      if (broken) cudaGraphDestroy(broken);
      (void)cudaGetLastError();
      FSDP_THROW(CudaError, "train.cuda_graphs: capturing a micro-batch's forward and backward "
                 "failed; something in it cannot be captured (a host synchronization or read "
                 "back, a device allocation outside the graph's pool, or work on a stream that "
                 "did not join the capture). Set train.cuda_graphs=false. Cause: ", e.what());
    }
    // An operation that cannot be captured but reported no error of its own (inside a
    // library) invalidates the capture: this is where that shows.
    graph_step("ending the capture of a micro-batch (an operation in its forward or backward "
               "could not be captured)",
               [&] { FSDP_CALL(cudaStreamEndCapture(stream, &m.graph)); });
  }
  // Only the loss may outlive the captured work: any other block of the pool still held
  // would be a tensor kept somewhere that every replay overwrites.
  const int64_t escaped = m.alloc->pool_live_blocks(m.pool);
  FSDP_CHECK(escaped == 1, InternalError, "train.cuda_graphs: ", escaped,
             " allocations made inside the captured micro-batch outlive it, but only its loss "
             "should (state created lazily inside it, which the eager warm-up did not create?)");
  m.loss = loss;
  graph_step("instantiating the captured micro-batch",
             [&] { FSDP_CALL(cudaGraphInstantiate(&m.exec, m.graph, 0)); });
  captures_++;
  join_side_streams_();
  graph_step("launching the captured micro-batch", [&] { FSDP_CALL(cudaGraphLaunch(m.exec, stream)); });
  replays_++;
  return m.loss;
}

Tensor MicroBatchGraph::launch(const Tensor& idx, const Tensor& tgt) {
  Impl& m = *impl_;
  FSDP_CHECK(m.exec != nullptr, InternalError, "train.cuda_graphs: replay before capture");
  FSDP_CHECK(idx.shape() == m.idx.shape() && tgt.shape() == m.tgt.shape(), ShapeError,
             "train.cuda_graphs: a micro-batch of ", idx.str(), " for a graph captured with ",
             m.idx.str(), " (every micro-batch must have the captured shape)");
  FSDP_CHECK(ctx_.stream() == m.stream, InternalError,
             "train.cuda_graphs: replay on another stream than the one captured on");
  ops::copy(ctx_, m.idx, idx);
  ops::copy(ctx_, m.tgt, tgt);
  join_side_streams_();
  graph_step("replaying the captured micro-batch",
             [&] { FSDP_CALL(cudaGraphLaunch(m.exec, m.stream.cuda_stream())); });
  replays_++;
  return m.loss;
}

#else  // CPU-only build: the plan refuses a CPU device, so nothing gets here.

Tensor MicroBatchGraph::capture(const Tensor&, const Tensor&, const Body&) {
  FSDP_THROW(DeviceError, "train.cuda_graphs: this build has no CUDA support (--config=cpu)");
}
Tensor MicroBatchGraph::launch(const Tensor&, const Tensor&) {
  FSDP_THROW(DeviceError, "train.cuda_graphs: this build has no CUDA support (--config=cpu)");
}

#endif

}  // namespace fsdp::train
