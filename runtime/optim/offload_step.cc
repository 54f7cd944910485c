#include "runtime/optim/offload_step.h"

#include <algorithm>

#include "kernels/ops.h"
#include "runtime/core/allocator.h"
#include "runtime/optim/optimizer.h"

namespace fsdp {
namespace {

Tensor flat(const Tensor& t) { return t.view(Shape{t.numel()}); }

// The host update splits a chunk into parts of this many elements, one per pool task.
constexpr int64_t kPartNumel = int64_t(1) << 20;

// The update's threads. Overlapped, it runs beside the thread that queues the next step's
// device work, which should not have to wait for a core: one fewer.
unsigned update_threads(const OffloadOptions& options) {
  const unsigned n = options.threads > 0 ? options.threads : host_threads_per_process(1);
  return options.overlap && n > 1 ? n - 1 : n;
}

}  // namespace

OffloadedAdamW::OffloadedAdamW(Context& ctx, const std::vector<OptimizerRange>& ranges,
                               const OffloadOptions& options)
    : ctx_(ctx),
      pool_(update_threads(options)),
      overlap_(options.overlap),
      down_(ctx.is_cuda() ? Stream::create_cuda(ctx.device().index) : Stream::cpu()),
      up_(ctx.is_cuda() ? Stream::create_cuda(ctx.device().index) : Stream::cpu()) {
  order_ = options.order;
  if (order_.empty())
    for (size_t i = 0; i < ranges.size(); ++i) order_.push_back(i);
  std::vector<bool> seen(ranges.size(), false);
  FSDP_CHECK(order_.size() == ranges.size(), ValueError, "cpu offload: an order of ",
             order_.size(), " ranges for ", ranges.size());
  for (size_t i : order_) {
    FSDP_CHECK(i < ranges.size() && !seen[i], ValueError, "cpu offload: the update order must "
               "list each of the ", ranges.size(), " ranges once (range ", i, ")");
    seen[i] = true;
  }
  std::vector<int64_t> numel;
  int64_t total = 0;
  DType grad_dtype = DType::f32, copy_dtype = DType::bf16;
  bool any_copy = false;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const OptimizerRange& r = ranges[i];
    FSDP_CHECK(r.main.device().is_cpu() && r.main.dtype() == DType::f32, ValueError,
               "cpu offload: range ", r.name, " needs f32 master weights in host memory, got ",
               r.main.str());
    if (i == 0) grad_dtype = r.grad.dtype();
    FSDP_CHECK(r.grad.dtype() == grad_dtype, DTypeError, "cpu offload: range ", r.name,
               " has ", dtype_name(r.grad.dtype()), " gradients, the others ",
               dtype_name(grad_dtype));
    if (r.param_copy.defined()) {
      FSDP_CHECK(!any_copy || r.param_copy.dtype() == copy_dtype, DTypeError,
                 "cpu offload: range ", r.name, " has ", dtype_name(r.param_copy.dtype()),
                 " compute weights, the others ", dtype_name(copy_dtype));
      copy_dtype = r.param_copy.dtype();
      any_copy = true;
    }
    total += r.main.numel();
  }
  for (size_t i : order_) numel.push_back(ranges[i].main.numel());
  const OffloadStaging staging = offload_staging(total, options.chunk_numel, options.slots);
  chunks_ = plan_offload_chunks(numel, options.chunk_numel);
  const std::vector<int64_t> last = last_chunk_of_ranges(chunks_, order_.size());
  last_chunk_.assign(ranges.size(), -1);
  for (size_t k = 0; k < order_.size(); ++k) last_chunk_[order_[k]] = last[k];
  for (int s = 0; s < staging.slots; ++s) {
    // Overlapped, the update reads the gradients from the host snapshot: no slots for them.
    if (!overlap_) {
      grad_slot_.push_back(ctx.empty_pinned(Shape{staging.slot_numel}, grad_dtype));
      staging_bytes_ += grad_slot_.back().nbytes();
    }
    if (any_copy) {
      copy_slot_.push_back(ctx.empty_pinned(Shape{staging.slot_numel}, copy_dtype));
      staging_bytes_ += copy_slot_.back().nbytes();
    }
    downloaded_.emplace_back();
    uploaded_.emplace_back();
  }
  chunk_uploaded_.resize(chunks_.size());
  if (overlap_ && total > 0) {
    // The gradients the background update reads, copied out of the buffers the next step's
    // backward writes into: in host memory, where the update reads them anyway.
    snapshot_ = ctx.empty_pinned(Shape{total}, grad_dtype);
    snapshot_bytes_ = snapshot_.nbytes();
    int64_t at = 0;
    for (const OptimizerRange& r : ranges) {
      snapshot_views_.push_back(snapshot_.narrow(0, at, r.main.numel()));
      at += r.main.numel();
    }
    snapshot_arrived_.resize(ranges.size());
  }
}

OffloadedAdamW::~OffloadedAdamW() {
  if (worker_.joinable()) worker_.join();
}

void OffloadedAdamW::download(size_t chunk, const std::vector<Tensor>& grads) {
  const size_t slot = chunk % grad_slot_.size();
  for (const OffloadPiece& p : chunks_[chunk].pieces)
    copy_bytes_async(grad_slot_[slot].narrow(0, p.slot_offset, p.numel),
                     flat(grads[order_[p.range]]).narrow(0, p.begin, p.numel), down_);
  downloaded_[slot].record(down_);
}

void OffloadedAdamW::run(const std::vector<OptimizerRange>& ranges,
                         const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                         const std::vector<Tensor>& exp_avg_sq, double weight_decay,
                         const ops::AdamWParams& common, bool grads_on_host) {
  const size_t slots = uploaded_.size();
  if (!grads_on_host)
    for (size_t c = 0; c < std::min(slots, chunks_.size()); ++c) download(c, grads);

  struct Part {
    const OffloadPiece* piece;
    int64_t begin, numel;  // within the piece
  };
  std::vector<Part> parts;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const size_t slot = c % slots;
    if (!grads_on_host) downloaded_[slot].synchronize();  // this chunk's gradients are here
    // From the snapshot: its ranges' copies have arrived (pieces are in plan order, so the
    // last piece's range was copied after the others).
    if (grads_on_host && !chunks_[c].pieces.empty())
      snapshot_arrived_[chunks_[c].pieces.back().range].synchronize();
    uploaded_[slot].synchronize();    // the slot's previous weights have left
    parts.clear();
    for (const OffloadPiece& p : chunks_[c].pieces)
      for (int64_t b = 0; b < p.numel; b += kPartNumel)
        parts.push_back({&p, b, std::min(kPartNumel, p.numel - b)});
    pool_.parallel_for(int64_t(parts.size()), [&](int64_t k) {
      const Part& part = parts[size_t(k)];
      const OffloadPiece& p = *part.piece;
      const size_t i = order_[p.range];
      const OptimizerRange& r = ranges[i];
      const int64_t begin = p.begin + part.begin, slot_at = p.slot_offset + part.begin;
      ops::AdamWParams a = common;
      a.weight_decay = r.weight_decay ? weight_decay : 0.0;
      auto slice = [&](const Tensor& t) { return flat(t).narrow(0, begin, part.numel); };
      // Gradients in host memory (the overlapped update's snapshot) are read where they are.
      ops::adamw_step_host_f32(
          host_, slice(r.main),
          grads_on_host ? slice(grads[i]) : grad_slot_[slot].narrow(0, slot_at, part.numel),
          slice(exp_avg[i]), slice(exp_avg_sq[i]), a,
          r.param_copy.defined() ? copy_slot_[slot].narrow(0, slot_at, part.numel) : Tensor());
    });
    for (const OffloadPiece& p : chunks_[c].pieces) {
      const OptimizerRange& r = ranges[order_[p.range]];
      if (!r.param_copy.defined()) continue;
      copy_bytes_async(flat(r.param_copy).narrow(0, p.begin, p.numel),
                       copy_slot_[slot].narrow(0, p.slot_offset, p.numel), up_);
    }
    uploaded_[slot].record(up_);
    if (overlap_) {
      chunk_uploaded_[c].record(up_);
      publish(c + 1);
    }
    if (!grads_on_host && c + slots < chunks_.size()) download(c + slots, grads);
  }
}

void OffloadedAdamW::publish(size_t chunks_done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    chunks_done_ = chunks_done;
  }
  progress_.notify_all();
}

void OffloadedAdamW::step(const std::vector<OptimizerRange>& ranges,
                          const std::vector<Tensor>& exp_avg,
                          const std::vector<Tensor>& exp_avg_sq, double weight_decay,
                          const ops::AdamWParams& common) {
  finish();
  if (chunks_.empty()) return;
  if (!overlap_) {
    std::vector<Tensor> grads;
    for (const OptimizerRange& r : ranges) grads.push_back(r.grad);
    // The gradients are final once the compute stream has reached this point (the step's
    // reductions and the norm ran on it).
    Event grads_final;
    grads_final.record(ctx_.stream());
    down_.wait(grads_final);
    run(ranges, grads, exp_avg, exp_avg_sq, weight_decay, common, false);
    // The next kernels on the compute stream see the new weights.
    Event uploads_done;
    uploads_done.record(up_);
    ctx_.stream().wait(uploads_done);
    return;
  }
  // Overlapped: copy the final gradients down to the host snapshot, then update from it in
  // the background. The next step zeroes and rewrites the originals on the compute stream,
  // so that stream waits for the copy.
  Event grads_final;
  grads_final.record(ctx_.stream());
  down_.wait(grads_final);
  // In the update's order, each range's arrival marked for the chunks that read it.
  for (size_t k = 0; k < order_.size(); ++k) {
    const size_t i = order_[k];
    copy_bytes_async(snapshot_views_[i], flat(ranges[i].grad), down_);
    snapshot_arrived_[k].record(down_);
  }
  Event snapshot_taken;
  snapshot_taken.record(down_);
  ctx_.stream().wait(snapshot_taken);
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = true;
    chunks_done_ = 0;
    error_ = nullptr;
  }
  worker_ = std::thread([this, &ranges, &exp_avg, &exp_avg_sq, weight_decay, common] {
    try {
      DeviceGuard device(ctx_.device());  // CUDA calls from this thread target ctx's device
      // run() waits for each chunk's part of the snapshot before the host reads it.
      run(ranges, snapshot_views_, exp_avg, exp_avg_sq, weight_decay, common, true);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_ = false;
    }
    progress_.notify_all();
  });
}

bool OffloadedAdamW::range_ready(size_t range, bool block, Event* ready) {
  FSDP_CHECK(range < last_chunk_.size(), ValueError, "cpu offload: range ", range, " of ",
             last_chunk_.size());
  *ready = Event();
  const int64_t last = last_chunk_[range];
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] { return !in_flight_ || error_ || int64_t(chunks_done_) > last; };
  if (!done()) {
    if (!block) return false;
    progress_.wait(lock, done);
  }
  if (error_) std::rethrow_exception(error_);
  // While the update runs, the range's chunk has an upload event; once it has finished (or
  // when none ran) the last chunk's event covers every range.
  if (last >= 0 && int64_t(chunks_done_) > last) *ready = chunk_uploaded_[size_t(last)];
  return true;
}

void OffloadedAdamW::finish() {
  if (worker_.joinable()) worker_.join();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fsdp
