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
// instead of a copy of the whole shard. The ranges are processed in `OffloadOptions::order`.
//
// Two ways to run a step:
// - in step (default): step() returns when the host's part is done, and the compute stream
//   waits for the last upload before the next step's kernels;
// - overlapped (OffloadOptions::overlap): step() copies the gradients down to a page-locked
//   host snapshot (the next step's backward rewrites their buffers, so the device waits for
//   that one copy; it holds no second copy of the shard) and returns; a background thread
//   runs the pipeline from the snapshot while the device runs the next forward. The copies
//   go down in the update's order and each chunk waits only for its own ranges' copies, so
//   the host starts on the first ranges while the later ones are still on their way. range_ready() tells
//   when a range's new compute weights are queued for upload and the event after which they
//   are on the device: ZeRO-3 waits for it per unit before gathering the unit's weights, so
//   the forward of the first units runs while the host still updates the later ones.
// On a CPU context the same code runs with synchronous copies (tests).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/thread_pool.h"
#include "runtime/optim/offload_plan.h"

namespace fsdp {

struct OptimizerRange;

struct OffloadOptions {
  int64_t chunk_numel = int64_t(16) << 20;  // elements per staging slot
  int slots = 3;                            // staging slots (pipeline depth)
  unsigned threads = 0;                     // host threads for the update (0: all available)
  bool overlap = false;  // run the update in the background, overlapped with the next forward
  std::vector<size_t> order;  // the order to update the ranges in (empty: as given)
};

class OffloadedAdamW {
 public:
  // `ranges`: master weights in host memory, gradients and compute weights (param_copy, may
  // be undefined) in ctx's memory; every gradient has one dtype, every copy one dtype.
  OffloadedAdamW(Context& ctx, const std::vector<OptimizerRange>& ranges,
                 const OffloadOptions& options);
  ~OffloadedAdamW();  // waits for an update in flight (its error, if any, is dropped)
  OffloadedAdamW(const OffloadedAdamW&) = delete;
  OffloadedAdamW& operator=(const OffloadedAdamW&) = delete;

  // One step over every range with the moments exp_avg[i] / exp_avg_sq[i] (host memory);
  // ranges that decay use `weight_decay`, the others none. The arguments must outlive the
  // step (overlapped: until finish()). Waits for the previous overlapped step first.
  void step(const std::vector<OptimizerRange>& ranges, const std::vector<Tensor>& exp_avg,
            const std::vector<Tensor>& exp_avg_sq, double weight_decay,
            const ops::AdamWParams& common);

  // Whether range `range`'s new compute weights are queued for upload (waiting until they
  // are when `block`); if so *ready is the event after which they are on the device (an
  // empty event when no update is in flight). Rethrows the background update's error.
  bool range_ready(size_t range, bool block, Event* ready);
  // Waits for the overlapped update in flight, if any, to finish; rethrows its error.
  void finish();

  size_t staging_bytes() const { return staging_bytes_; }    // page-locked staging slots
  size_t snapshot_bytes() const { return snapshot_bytes_; }  // overlap: host gradient copy
  unsigned threads() const { return pool_.size(); }
  size_t chunks() const { return chunks_.size(); }

 private:
  // The pipeline over every chunk; gradients read from `grads` (one per range): through
  // the staging slots from device memory, or where they lie when `grads_on_host`.
  void run(const std::vector<OptimizerRange>& ranges, const std::vector<Tensor>& grads,
           const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
           double weight_decay, const ops::AdamWParams& common, bool grads_on_host);
  void download(size_t chunk, const std::vector<Tensor>& grads);
  void publish(size_t chunks_done);  // overlap: chunks [0, chunks_done) are queued up

  Context& ctx_;
  Context host_;
  ThreadPool pool_;
  bool overlap_;
  std::vector<size_t> order_;           // plan index -> range index
  std::vector<int64_t> last_chunk_;     // range index -> its last chunk (-1: empty)
  std::vector<OffloadChunk> chunks_;    // pieces' `range` are plan indices
  std::vector<Tensor> grad_slot_, copy_slot_;  // per slot: gradients down, weights up
  std::vector<Event> downloaded_, uploaded_;   // per slot: last copy into / out of it
  Stream down_, up_;
  size_t staging_bytes_ = 0;

  // Overlap: the gradient snapshot, the background thread and its progress.
  Tensor snapshot_;                     // flat, the gradients' dtype, page-locked host memory
  std::vector<Tensor> snapshot_views_;  // per range
  std::vector<Event> snapshot_arrived_; // per plan index: recorded on down_ after its copy
  size_t snapshot_bytes_ = 0;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable progress_;
  bool in_flight_ = false;
  size_t chunks_done_ = 0;
  std::vector<Event> chunk_uploaded_;  // per chunk, recorded on up_ after its upload
  std::exception_ptr error_;
};

}  // namespace fsdp
