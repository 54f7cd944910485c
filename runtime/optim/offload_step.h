// OffloadedAdamW: the AdamW step of the CPU-offloaded optimizer (optimizer.cpu_offload).
//
// The master weights and Adam moments stay in page-locked host memory; the gradients and the
// compute weights stay on the device. A step streams the shard through a few chunk-sized host
// staging slots (offload_plan.h), as a pipeline on two copy streams:
//
//   down stream: gradient chunk c+S -> slot      (after the step's last reduction)
//   host:        AdamW on chunk c, on the pool's threads, writing the new compute weights
//                of chunk c into the slot's upload buffer
//   up stream:   compute weights of chunk c -> device
//
// so the copies both ways overlap the host's update, and the host needs S slots of staging
// instead of a copy of the whole shard. The compute stream waits for the last upload before
// the next step's kernels. On a CPU context the same code runs with synchronous copies
// (tests).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/nn_ops.h"
#include "runtime/core/context.h"
#include "runtime/core/thread_pool.h"
#include "runtime/optim/offload_plan.h"

namespace fsdp {

struct OptimizerRange;

struct OffloadOptions {
  int64_t chunk_numel = int64_t(16) << 20;  // elements per staging slot
  int slots = 3;                            // staging slots (pipeline depth)
  unsigned threads = 0;                     // host threads for the update (0: all available)
};

class OffloadedAdamW {
 public:
  // `ranges`: master weights in host memory, gradients and compute weights (param_copy, may
  // be undefined) in ctx's memory; every gradient has one dtype, every copy one dtype.
  OffloadedAdamW(Context& ctx, const std::vector<OptimizerRange>& ranges,
                 const OffloadOptions& options);

  // One step over every range with the moments exp_avg[i] / exp_avg_sq[i] (host memory);
  // ranges that decay use `weight_decay`, the others none. Returns when the host's part is
  // done; the compute stream waits for the uploads.
  void step(const std::vector<OptimizerRange>& ranges, const std::vector<Tensor>& exp_avg,
            const std::vector<Tensor>& exp_avg_sq, double weight_decay,
            const ops::AdamWParams& common);

  size_t staging_bytes() const { return staging_bytes_; }  // page-locked staging slots
  unsigned threads() const { return pool_.size(); }
  size_t chunks() const { return chunks_.size(); }

 private:
  void download(size_t chunk, const std::vector<OptimizerRange>& ranges);

  Context& ctx_;
  Context host_;
  ThreadPool pool_;
  std::vector<OffloadChunk> chunks_;
  std::vector<Tensor> grad_slot_, copy_slot_;  // per slot: gradients down, weights up
  std::vector<Event> downloaded_, uploaded_;   // per slot: last copy into / out of it
  Stream down_, up_;
  size_t staging_bytes_ = 0;
};

}  // namespace fsdp
