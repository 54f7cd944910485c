// Optimizers over flat shards: AdamW (decoupled weight decay), SGD, and Muon with AdamW.
//
// An optimizer is given, once, the list of ranges it owns (OptimizerRange: master weights,
// the gradient to read, the compute weights to refresh, and whether to decay), typically the
// shards a ShardedModel hands out. It allocates its state beside them (Adam's moments, f32
// or bf16) and updates only those ranges: a sharded optimizer is the same code given
// shards. State is created at construction with zeros and the step count 0; the first step
// is step 1 (no fake step: bias correction starts right, so the first update has full size).
//
// Muon (OptimizerKind::muon) is given the layout of its matrices (a MuonOrthogonalizer): the
// ranges are split where Muon's parameters begin and end; Muon's ranges (matrix) keep one
// momentum buffer (exp_avg; no exp_avg_sq) and are updated unit by unit with their whole
// matrices orthogonalized (muon.h), the others by AdamW at config.adamw_lr_ratio times the
// learning rate.
//
// CPU offload: when the ranges' master weights are in host memory and the context is a
// CUDA one (FsdpOptions::offload_main), the moments live in page-locked host memory too and
// a step runs on the host (OffloadedAdamW, offload_step.h): the gradients are streamed down
// in chunks, AdamW updates the master weights on the host's cores, and the new compute
// weights are streamed back up.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/optim/muon.h"
#include "runtime/optim/offload_step.h"
#include "runtime/optim/optimizer_kind.h"

namespace fsdp {

struct OptimizerRange {
  std::string name;
  Tensor main;        // master weights, updated in place
  Tensor grad;        // gradient (any floating dtype), scaled by grad_scale at the step
  Tensor param_copy;  // compute weights rewritten from main after the update (may be undefined)
  bool weight_decay = false;
  // Where it lies: the unit (index in the sharding plan) and the first element of the
  // unit's shard it covers (-1: not a shard's; Muon needs it).
  int unit = -1;
  int64_t shard_offset = 0;
  bool matrix = false;  // Muon: part of a matrix Muon updates (set by the Optimizer)
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::adamw;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
  DType moments_dtype = DType::f32;
  MuonOptions muon;             // OptimizerKind::muon
  double adamw_lr_ratio = 1.0;  // Muon: AdamW's learning rate over the matrices'
  OffloadOptions offload;  // CPU offload only: staging and host threads
  // Tests only: run the offloaded AdamW on a CPU context too (its copies synchronous), so
  // layouts that need a GPU per rank can prove its numbers on CPU ranks.
  bool offload_on_cpu = false;
};

class Optimizer {
 public:
  // `muon`: the layout of Muon's matrices, required by OptimizerKind::muon (else ignored).
  Optimizer(Context& ctx, std::vector<OptimizerRange> ranges, const OptimizerConfig& config,
            std::unique_ptr<MuonOrthogonalizer> muon = nullptr);

  // One update with learning rate `lr`; every gradient is multiplied by grad_scale first
  // (the mean over micro-batches and the clipping factor, folded into one number).
  void step(double lr, double grad_scale);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t step) { step_ = step; }  // restoring from a checkpoint
  const OptimizerConfig& config() const { return config_; }
  const std::vector<OptimizerRange>& ranges() const { return ranges_; }
  // Adam's first and second moments of range i (undefined for SGD; Muon's momentum and an
  // undefined second moment for its matrix ranges).
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  // What the optimizer's allocations cost on the device: the moments (none with CPU offload)
  // and Muon's exchange buffers.
  size_t state_bytes() const;
  // CPU offload: the moments, the staging and the overlapped update's gradient snapshot.
  size_t host_state_bytes() const { return host_bytes_; }
  bool offloaded() const { return offload_ != nullptr; }
  const OffloadedAdamW* offload() const { return offload_.get(); }
  // CPU offload overlapped with the next forward (OffloadOptions::overlap): waits for the
  // update in flight, rethrowing its error; call before reading or writing the master
  // weights or the moments (checkpoints). A no-op otherwise.
  void finish_update() {
    if (offload_) offload_->finish();
  }
  // Whether range i's new compute weights are queued for the device (see
  // OffloadedAdamW::range_ready); true with an empty event unless an overlapped update runs.
  bool range_ready(size_t i, bool block, Event* ready) {
    if (offload_) return offload_->range_ready(i, block, ready);
    *ready = Event();
    return true;
  }

 private:
  Context& ctx_;
  std::vector<OptimizerRange> ranges_;
  OptimizerConfig config_;
  // Muon: splits the ranges at its matrices' pieces (matrix) and lists each Muon unit's.
  void split_for_muon();
  void muon_step(double lr, double grad_scale);

  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // views into one allocation per moment
  size_t arena_bytes_ = 0;
  int64_t step_ = 0;
  // CPU offload: the host's update and its staging, and the host memory it all takes.
  std::unique_ptr<OffloadedAdamW> offload_;
  size_t host_bytes_ = 0;
  // Muon: the layout and exchange, each Muon unit's matrix ranges, and the shard-sized
  // update and result buffers (the largest Muon unit's shard).
  std::unique_ptr<MuonOrthogonalizer> muon_;
  std::vector<std::vector<size_t>> muon_ranges_;  // per Muon unit
  Tensor muon_update_, muon_out_;
};

// Scale that brings a gradient of norm `norm` down to `max_norm` (1 when already within it,
// or when max_norm <= 0 disables clipping). The caller handles a non-finite norm.
double clip_coefficient(double norm, double max_norm);

}  // namespace fsdp
