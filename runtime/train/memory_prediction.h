// What a run of a recipe will hold per rank, predicted from the sharding plan before
// anything is allocated: the dry run prints it, and the trainer refuses a run that cannot
// fit the device (or, on the CPU, the host's memory shared by its ranks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "models/language_model.h"
#include "runtime/fsdp/memory.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

struct MemoryPrediction {
  ShardingPlan plan;
  MemoryBreakdown fsdp;         // the sharded model's buffers
  size_t optimizer = 0;         // on the device: Adam's moments (none with CPU offload)
  size_t optimizer_state = 0;   // Adam's moments wherever they live
  int64_t activations = 0;      // one micro-batch's, estimated
  int64_t offload_staging = 0;  // CPU offload: the pinned gradient and weight staging and
                                // (overlapped) the host copy of the gradients
  int64_t fp8_weight_casts = 0; // FP8 weights cast once per step: both layouts, held for it
  int64_t update_norms = 0;     // logger.log_update_norms: a device copy of the master shards
  // The activations with the first N blocks recomputed whole (full recompute of N blocks),
  // for N = 0 .. the number of blocks: what a run that does not fit can trade.
  std::vector<int64_t> activations_recomputing;

  int64_t device_peak() const {
    return int64_t(fsdp.total() + optimizer) + activations + fp8_weight_casts + update_norms;
  }
  // What a rank holds in host memory beside it with CPU offload (page-locked on a GPU): the
  // master weights, the moments and the staging (0 without offload).
  int64_t host_offload() const {
    if (fsdp.host_main_weights == 0) return 0;
    return int64_t(fsdp.host_main_weights) + int64_t(optimizer_state) + offload_staging;
  }
  // The largest part of device_peak(), as "activations (12.0 GiB)".
  std::string largest_part() const;
};

// For a recipe with its device and world resolved, and the model it builds (specs).
MemoryPrediction predict_memory(const Recipe& recipe, models::LanguageModel& model,
                                const Mesh& mesh);

// The address space a process needs beyond the memory the prediction counts: its threads'
// stacks, OpenBLAS's buffers (128 MiB per thread), MPI's and the C++ runtime's mappings (a
// 2-core CPU run predicted at 335 MiB maps about 1.8 GiB): 2 GiB plus 128 MiB per hardware
// thread. (Below about 1 GiB plus OpenBLAS's buffers, OpenBLAS's own initializer, which runs
// before main, loops on its failing allocation: no check of ours can run that early.)
int64_t runtime_address_space();

// ConfigError when this process's address-space limit (ulimit -v, RLIMIT_AS) is below
// `need` bytes, naming the limit, what needs the space (`what`) and the setting that
// fits. Without it such a run spins in OpenBLAS or dies inside MPI without a word.
void check_address_space(int64_t need, const std::string& what);

// ConfigError when `prediction` does not fit `device`: the predicted peaks of the
// `sharing_ranks` that use it (on a GPU, those the staged backend puts on it; on the CPU,
// this host's ranks) above its memory (a GPU's free memory when one rank has it alone); on
// a GPU also when the `host_ranks` ranks on this host offload more than its memory
// (check_host_memory_fits).
// The message names the prediction, the capacity, the largest part, and the full-recompute
// setting that would fit when one does (else the keys that size the run).
void check_memory_fits(const MemoryPrediction& prediction, Device device, int sharing_ranks,
                       int host_ranks);

// ConfigError when `host_ranks` ranks' CPU offload (MemoryPrediction::host_offload(),
// page-locked, so it cannot be paged out) exceeds `host_capacity` bytes: names the need, its
// parts, the largest, and the settings that shrink it.
void check_host_memory_fits(const MemoryPrediction& prediction, int host_ranks,
                            int64_t host_capacity);

}  // namespace fsdp::train
