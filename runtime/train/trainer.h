// Trainer: one training run from a resolved recipe, as a library call.
//
//   Recipe recipe = load_recipe("configs/tiny.json", {"optimizer.lr=3e-4"});
//   Trainer trainer(recipe, TrainerOptions{});
//   TrainResult result = trainer.run();
//
// Construction sets everything up on this process: the world (rank, device, backend) and
// its mesh communicators, the model as specs, its sharding (fully_shard: only this rank's
// shards are materialized and initialized), the optimizer over those shards, the data
// loaders for this data-parallel rank, the output directory (run_config.json) and, when
// asked, the checkpoint to resume from. run() trains until train.train_iters, printing
// rank-0 step lines and writing metrics.jsonl, evaluates at intervals, saves checkpoints at
// intervals and when a stop is requested (SIGTERM / SIGUSR1 in tools/train), and at the end
// writes the loss picture and prints a short generated sample.
//
// Every rank runs the same calls in the same order; the Trainer never calls exit(). Errors
// are fsdp::Error exceptions (ConfigError for a recipe that cannot run here).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_calls.h"
#include "runtime/fsdp/options.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

struct TrainerOptions {
  // Resume from recipe.checkpoint.load when it names a checkpoint (false: start fresh).
  bool resume = true;
  // Polled at every step boundary, and inside long steps between micro-batches (every one
  // on the CPU, every 8th on a GPU, where each poll makes the host wait for the device);
  // when it returns true on any rank, every rank saves a checkpoint of the last completed
  // step (if saving is configured; a step stopped midway is dropped and its data read
  // again on resume) and run() returns early with `stopped` set.
  std::function<bool()> stop_requested;
  // Where rank 0 prints; nullptr silences the run (tests).
  std::FILE* out = stdout;
  // Print a generated sample at the end of the run (from this prompt).
  bool print_sample = true;
  std::string sample_prompt = "It is a truth universally acknowledged";
  int64_t sample_tokens = 48;
  // Steps left out of the timing averages of TrainResult (warm-up: allocator, plans).
  int64_t warmup_steps = 1;
  // Benchmarks only (tools/bench): replace collectives by local copies to time compute.
  bool skip_collectives = false;
  // Benchmarks: time every collective with CUDA events (TrainResult::collectives).
  bool time_collectives = false;
  // Profiling (tools/bench --profile): open the profiler's capture window for the timed
  // steps only (profiler_capture in runtime/core/nvtx.h).
  bool profile_timed_steps = false;
  // Train on this process alone (WorldOptions::alone), whatever launched it: a
  // single-process run inside a multi-rank program (the tests' reference runs).
  bool alone = false;
  // Tests only: run mixed_precision.fp8 on the CPU, whose kernels simulate FP8 with the
  // GPU's bytes and scales (kernels/fp8.h); a CPU run refuses fp8 otherwise.
  bool simulate_fp8_on_cpu = false;
  // Tests only: run optimizer.cpu_offload on the CPU through the offloaded optimizer
  // (OptimizerConfig::offload_on_cpu); a CPU run refuses cpu_offload otherwise.
  bool offload_on_cpu = false;
  // Called once with the first communication failure's message (WorldOptions::on_failure).
  std::function<void(const std::string&)> on_comm_failure;
};

struct TrainResult {
  int64_t first_step = 0;            // steps completed before this run (resume), 0 if fresh
  int64_t steps = 0;                 // steps completed at the end
  std::vector<double> losses;        // mean loss of each step this run trained
  std::vector<double> grad_norms;    // each step's global gradient norm, before clipping
  std::vector<double> val_losses;    // each evaluation's mean validation loss
  // MoE models: each step's auxiliary losses (StepMetrics::moe_aux_loss, moe_z_loss) and
  // load (moe_max_load), empty for dense models; with expert parallelism, this rank's
  // all-to-alls over the expert-parallel group and all-gathers and reduce-scatters over the
  // experts' shard group in this run's steps (0 without it).
  struct Moe {
    std::vector<double> aux_losses, z_losses, max_loads;
    uint64_t expert_all_to_alls = 0, expert_all_gathers = 0, expert_reduce_scatters = 0;
  };
  Moe moe;
  // The sharded model's collectives since the last step began (its evaluation after it
  // included): this rank's count and bytes by kind (fsdp::IssuedCollectives).
  IssuedCollectives last_step_collectives;
  // mixed_precision.fp8: the linear layers run in FP8 ("h.1.attn.qkv"), the blocks kept in
  // bf16 ("h.0"), the layers of FP8 blocks kept in bf16 with why (Fp8Report), and the output
  // head's layer name when it runs in FP8; empty without fp8.
  struct Fp8 {
    std::vector<std::string> layers, bf16_blocks, bf16_layers;
    std::string classifier;
  };
  Fp8 fp8;
  bool stopped = false;              // ended early on a stop request
  std::string sample;                // the generated text, if any
  // Timing over the steps after options.warmup_steps (all ranks together).
  double tokens_per_sec = 0;
  double step_time_s = 0;            // mean step time
  double optimizer_time_s = 0;       // mean time of the optimizer step and weight install
  // Mean host time to issue a step's work (before waiting for its loss): near step_time_s
  // when the host, not the device, limits the step.
  double issue_time_s = 0;
  // The host's time to queue the forwards and backwards of a step's micro-batches, and the
  // device time from the first forward's start to the last backward's end: when the two are
  // close, the device waited for the host.
  double queue_time_s = 0, forward_backward_s = 0;
  // With TrainerOptions::time_collectives: per step, this rank's collectives by kind
  // (count, bytes, device time from reaching each until it ended), averaged like the above.
  struct Collective {
    double count = 0, bytes = 0, ms = 0;
  };
  Collective all_gathers, reduce_scatters, all_reduces;
  // Device allocations per timed step, and how many of them needed new memory from the
  // system (cudaMalloc can wait for the device, stalling the host that queues the work).
  double allocs_per_step = 0, system_allocs_per_step = 0;
  // Micro-batches run as CUDA graph launches (train.cuda_graphs) since the Trainer started.
  int64_t cuda_graph_replays = 0;
  double tflops_per_device = 0;      // model FLOP/s per device (GPU runs)
  double mfu = 0;                    // model FLOPs utilization (GPU runs)
  int64_t peak_allocated_bytes = 0;  // this rank's device allocator peaks
  int64_t peak_reserved_bytes = 0;
  // GPU runs: the device's memory in use at the end of the run that this rank's allocator
  // does not hold (CUDA contexts, libraries' workspaces, communicators' buffers, other
  // processes): the part of the GPU a memory plan cannot give to the model.
  int64_t device_bytes_outside_allocator = 0;
};

class Trainer {
 public:
  Trainer(const Recipe& recipe, const TrainerOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainResult run();

  const Recipe& recipe() const;
  int rank() const;
  int world_size() const;

 private:
  struct State;
  TrainResult run_steps();
  std::unique_ptr<State> s_;
};

}  // namespace fsdp::train
