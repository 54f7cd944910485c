// Trainer::State: everything a Trainer holds, private to runtime/train. Its set-up is in
// trainer_start.cc; the step and the loop are in trainer.cc.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>
#include "collectives/bootstrap.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "models/generate.h"
#include "runtime/autograd/graph.h"
#include "runtime/core/nvtx.h"
#include "runtime/core/thread_pool.h"
#include "runtime/data/assets.h"
#include "runtime/data/tokenizer.h"
#include "runtime/checkpoint/rank_agreement.h"
#include "runtime/parallel/context_parallel.h"
#include "runtime/parallel/expert_parallel.h"
#include "runtime/parallel/fp8_delayed_scaling.h"
#include "runtime/parallel/fp8_plan.h"
#include "runtime/parallel/grad_sync.h"
#include "runtime/parallel/muon_matrices.h"
#include "runtime/parallel/tensor_parallel.h"
#include "runtime/train/checkpointing.h"
#include "runtime/train/cuda_graph.h"
#include "runtime/train/metrics.h"
#include "runtime/train/memory_prediction.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/tensorboard.h"
#include "runtime/train/plot.h"
#include "runtime/train/run_stats.h"
#include "runtime/train/step_participants.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/trainer_setup.h"
#include "runtime/train/token_uploader.h"
#include "runtime/train/trainer.h"

namespace fsdp::train {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Members are destroyed in reverse order: the sharded model (its hooks) before the model,
// tensors before their context, communicators before the world.
struct Trainer::State {
  Recipe recipe;
  TrainerOptions options;
  // The world and the device.
  std::unique_ptr<World> world;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<MeshCommunicators> comms;
  std::unique_ptr<Context> ctx;
  int dp_rank = 0, dp_size = 1;
  int64_t accum = 1;  // micro-batches per rank per step
  // The model, its sharding and its optimizer. The tensor- and context-parallel groups
  // outlive the model, whose split layers keep pointers to them.
  models::ModelConfig model_config;
  std::unique_ptr<CommunicatorParallelGroup> tp_group;
  std::unique_ptr<CommunicatorParallelGroup> cp_group;
  std::unique_ptr<CommunicatorExpertParallelGroup> ep_group;
  // Context parallelism: this rank's tokens of each sequence (every rank reads the whole
  // micro-batch of its data-parallel rank and keeps these).
  std::optional<nn::ContextParallelLayout> cp_layout;
  std::unique_ptr<models::LanguageModel> model;
  FsdpOptions fsdp_options;
  std::unique_ptr<ShardedModel> sharded;
  std::unique_ptr<MuonMatrices> muon_matrices;  // optimizer "muon": what it orthogonalizes
  std::unique_ptr<Optimizer> optimizer;
  LrSchedule schedule;
  int64_t n_params = 0;
  double flops_per_token = 0;
  MemoryPrediction memory_plan;  // what the run was predicted to hold (and checked against)
  // Data.
  std::unique_ptr<data::DataLoader> train_data, val_data;
  std::unique_ptr<TokenUploader> tokens;
  // Output and checkpoints (the writers on rank 0 only).
  std::unique_ptr<RunCheckpoints> checkpoints;
  std::unique_ptr<StepLogWriter> metrics;
  std::unique_ptr<StepLogWriter> samples_log;  // logger.samples_file
  std::unique_ptr<TensorBoardWriter> tensorboard;  // logger.tensorboard_dir (rank 0)
  // For the step line's estimate of the time left: when this process's first step began.
  Clock::time_point loop_start;
  int64_t loop_first_step = 0;
  std::vector<StepMetrics> history;            // what the loss picture draws
  // The tokenizer of the end-of-run sample; null when no sample is printed (not asked for,
  // or the model's vocabulary cannot hold the tokenizer's: a finished run never fails there).
  std::unique_ptr<data::Gpt2Tokenizer> sample_tokenizer;
  int64_t step = 0;  // optimizer steps completed
  std::unique_ptr<StepClock> clock;
  std::string fp8_line;  // mixed_precision.fp8: the start-up line of what runs in FP8
  // fp8_recipe "delayed": the FP8 layers' amax histories (null otherwise).
  std::unique_ptr<Fp8DelayedScaling> fp8_delayed;
  // The features that take part in every step (MoE, FP8, update norms), in order.
  std::vector<std::unique_ptr<StepParticipant>> participants;
  std::vector<size_t> participant_values;  // how many values each gave this step

  // train.cuda_graphs: runs each micro-batch's forward and backward eagerly or as a graph
  // replay (null when off). Declared last: destroyed before the model and the context.
  std::unique_ptr<MicroBatchGraph> graphs;

  // Set-up, in order.
  void setup_world();
  // ConfigError on every rank if the ranks were started with different recipes, naming the
  // first key that differs (a different lr would train silently; a different train_iters
  // would end in a mismatched collective).
  void check_same_recipe_on_every_rank();
  void setup_model_and_sharding();
  // mixed_precision.fp8: refused where FP8 cannot run; marks the blocks' linear layers.
  void apply_fp8_plan();
  void setup_data();
  void setup_output();
  void print_startup_report() const;
  void prepare_sample();
  // The tokens of a micro-batch this rank computes: `rows` itself, or under context
  // parallelism its chunks of each sequence (in `scratch`).
  const std::vector<int32_t>& local_tokens(const std::vector<int32_t>& rows,
                                           std::vector<int32_t>& scratch) const {
    if (!cp_layout) return rows;
    scratch = split_sequences(rows, recipe.train.micro_batch_size, *cp_layout);
    return scratch;
  }

  void print(const std::string& line) const {
    if (world->rank() == 0 && options.out) {
      std::fprintf(options.out, "%s\n", line.c_str());
      std::fflush(options.out);
    }
  }
  // Sums `values` over every rank (tiny host vectors: losses, flags).
  std::vector<double> sum_over_ranks(const std::vector<double>& values);
  // One optimizer step; returns this rank's summed micro-batch losses, or nullopt when a
  // stop was requested between its micro-batches (the step is dropped: no update).
  std::optional<double> train_step(double lr, double* grad_norm);
  // The values the step's all-reduce sums: this rank's loss, its stop request, then each
  // participant's local_values.
  std::vector<double> step_values(double local_loss, bool stop_here);
  // After the update: each participant's sums into the step's metrics.
  void finish_participants(const std::vector<double>& summed, StepMetrics& m);
  // The end of the run: counts, the participants' reports, timing, the loss picture and
  // the sample.
  void finish_run(TrainResult& result, RunStats& stats);
  // Whether any rank was asked to stop (collective; every rank calls it at the same point).
  bool stop_agreed();
  // logger.samples_file: the global batch the next step reads (rank 0 writes it).
  void log_samples();
  double evaluate();
  // The step line, the metrics record and the picture's history (logged steps only).
  void log_step(const StepMetrics& m, bool evaluated);
  std::string sample_text();
};

}  // namespace fsdp::train
