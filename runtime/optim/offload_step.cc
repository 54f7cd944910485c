#include "runtime/optim/offload_step.h"

#include <algorithm>

#include "runtime/optim/optimizer.h"

namespace fsdp {
namespace {

Tensor flat(const Tensor& t) { return t.view(Shape{t.numel()}); }

// The host update splits a chunk into parts of this many elements, one per pool task.
constexpr int64_t kPartNumel = int64_t(1) << 20;

}  // namespace

OffloadedAdamW::OffloadedAdamW(Context& ctx, const std::vector<OptimizerRange>& ranges,
                               const OffloadOptions& options)
    : ctx_(ctx),
      pool_(options.threads > 0 ? options.threads : host_threads_per_process(1)),
      down_(ctx.is_cuda() ? Stream::create_cuda(ctx.device().index) : Stream::cpu()),
      up_(ctx.is_cuda() ? Stream::create_cuda(ctx.device().index) : Stream::cpu()) {
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
    numel.push_back(r.main.numel());
    total += r.main.numel();
  }
  const OffloadStaging staging = offload_staging(total, options.chunk_numel, options.slots);
  chunks_ = plan_offload_chunks(numel, options.chunk_numel);
  for (int s = 0; s < staging.slots; ++s) {
    grad_slot_.push_back(ctx.empty_pinned(Shape{staging.slot_numel}, grad_dtype));
    staging_bytes_ += grad_slot_.back().nbytes();
    if (any_copy) {
      copy_slot_.push_back(ctx.empty_pinned(Shape{staging.slot_numel}, copy_dtype));
      staging_bytes_ += copy_slot_.back().nbytes();
    }
    downloaded_.emplace_back();
    uploaded_.emplace_back();
  }
}

void OffloadedAdamW::download(size_t chunk, const std::vector<OptimizerRange>& ranges) {
  const size_t slot = chunk % grad_slot_.size();
  for (const OffloadPiece& p : chunks_[chunk].pieces)
    copy_bytes_async(grad_slot_[slot].narrow(0, p.slot_offset, p.numel),
                     flat(ranges[p.range].grad).narrow(0, p.begin, p.numel), down_);
  downloaded_[slot].record(down_);
}

void OffloadedAdamW::step(const std::vector<OptimizerRange>& ranges,
                          const std::vector<Tensor>& exp_avg,
                          const std::vector<Tensor>& exp_avg_sq, double weight_decay,
                          const ops::AdamWParams& common) {
  if (chunks_.empty()) return;
  // The gradients are final once the compute stream has reached this point (the step's
  // reductions and the norm ran on it).
  Event grads_final;
  grads_final.record(ctx_.stream());
  down_.wait(grads_final);
  const size_t slots = grad_slot_.size();
  for (size_t c = 0; c < std::min(slots, chunks_.size()); ++c) download(c, ranges);

  struct Part {
    const OffloadPiece* piece;
    int64_t begin, numel;  // within the piece
  };
  std::vector<Part> parts;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const size_t slot = c % slots;
    downloaded_[slot].synchronize();  // this chunk's gradients are here
    uploaded_[slot].synchronize();    // the slot's previous weights have left
    parts.clear();
    for (const OffloadPiece& p : chunks_[c].pieces)
      for (int64_t b = 0; b < p.numel; b += kPartNumel)
        parts.push_back({&p, b, std::min(kPartNumel, p.numel - b)});
    pool_.parallel_for(int64_t(parts.size()), [&](int64_t k) {
      const Part& part = parts[size_t(k)];
      const OffloadPiece& p = *part.piece;
      const OptimizerRange& r = ranges[p.range];
      const int64_t begin = p.begin + part.begin, slot_at = p.slot_offset + part.begin;
      ops::AdamWParams a = common;
      a.weight_decay = r.weight_decay ? weight_decay : 0.0;
      auto slice = [&](const Tensor& t) { return flat(t).narrow(0, begin, part.numel); };
      ops::adamw_step_host_f32(
          host_, slice(r.main), grad_slot_[slot].narrow(0, slot_at, part.numel),
          slice(exp_avg[p.range]), slice(exp_avg_sq[p.range]), a,
          r.param_copy.defined() ? copy_slot_[slot].narrow(0, slot_at, part.numel) : Tensor());
    });
    for (const OffloadPiece& p : chunks_[c].pieces) {
      const OptimizerRange& r = ranges[p.range];
      if (!r.param_copy.defined()) continue;
      copy_bytes_async(flat(r.param_copy).narrow(0, p.begin, p.numel),
                       copy_slot_[slot].narrow(0, p.slot_offset, p.numel), up_);
    }
    uploaded_[slot].record(up_);
    if (c + slots < chunks_.size()) download(c + slots, ranges);
  }
  // The next kernels on the compute stream see the new weights.
  Event uploads_done;
  uploads_done.record(up_);
  ctx_.stream().wait(uploads_done);
}

}  // namespace fsdp
