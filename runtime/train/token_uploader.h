// TokenUploader: each micro-batch's (B, T) tokens to the device through page-locked
// staging, one slot per tensor of the step: a copy from pageable memory could make the host
// wait for the device, and then the device would wait for the host to queue the next
// micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace fsdp::train {

class TokenUploader {
 public:
  explicit TokenUploader(Context& ctx) : ctx_(ctx) {}

  // The tokens of `slot` on the device, uploaded asynchronously.
  Tensor upload(size_t slot, const std::vector<int32_t>& tokens, int64_t B, int64_t T);

 private:
  Context& ctx_;
  std::vector<Tensor> staging_;
  std::vector<Event> uploaded_;  // after each slot's upload
};

}  // namespace fsdp::train
