#include "runtime/train/token_uploader.h"

#include <algorithm>

#include "kernels/ops.h"

namespace fsdp::train {

Tensor TokenUploader::upload(size_t slot, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  if (ctx_.device().is_cpu()) return ops::from_host<int32_t>(ctx_, tokens, Shape{B, T});
  if (staging_.size() <= slot) {
    staging_.resize(slot + 1);
    uploaded_.resize(slot + 1);
  }
  Tensor& staged = staging_[slot];
  if (!staged.defined() || staged.numel() != B * T) staged = ctx_.empty_pinned(Shape{B, T}, DType::i32);
  uploaded_[slot].synchronize();  // the slot's previous upload has left (long ago)
  std::copy(tokens.begin(), tokens.end(), staged.data<int32_t>());
  Tensor on_device = ctx_.empty(Shape{B, T}, DType::i32);
  copy_bytes_async(on_device, staged, ctx_.stream());
  uploaded_[slot].record(ctx_.stream());
  return on_device;
}

}  // namespace fsdp::train
