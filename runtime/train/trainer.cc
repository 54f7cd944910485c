// Trainer: set-up (world, model and sharding, data, output) and the training loop. The
// run's accounting (timing, throughput, memory) is in run_stats.h.
#include "runtime/train/trainer.h"

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
#include "runtime/parallel/tensor_parallel.h"
#include "runtime/train/checkpointing.h"
#include "runtime/train/cuda_graph.h"
#include "runtime/train/metrics.h"
#include "runtime/train/moe_step.h"
#include "runtime/train/memory_prediction.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/tensorboard.h"
#include "runtime/train/plot.h"
#include "runtime/train/run_stats.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/trainer_setup.h"
#include "runtime/train/update_norms.h"

namespace fsdp::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Uploads each micro-batch's (B, T) tokens through page-locked staging, one slot per
// tensor of the step: a copy from pageable memory could make the host wait for the device,
// and then the device would wait for the host to queue the next micro-batch.
class TokenUploader {
 public:
  explicit TokenUploader(Context& ctx) : ctx_(ctx) {}

  // The tokens of `slot` on the device, uploaded asynchronously.
  Tensor upload(size_t slot, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
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

 private:
  Context& ctx_;
  std::vector<Tensor> staging_;
  std::vector<Event> uploaded_;  // after each slot's upload
};

}  // namespace

// Members are destroyed in reverse order: the sharded model (its hooks) before the model,
// tensors before their context, communicators before the world.
struct ExpertCounts {
  uint64_t all_to_alls = 0, all_gathers = 0, reduce_scatters = 0;
};

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
  std::unique_ptr<CommunicatorTensorParallelGroup> tp_group;
  std::unique_ptr<CommunicatorTensorParallelGroup> cp_group;
  std::unique_ptr<CommunicatorExpertParallelGroup> ep_group;
  // Context parallelism: this rank's tokens of each sequence (every rank reads the whole
  // micro-batch of its data-parallel rank and keeps these).
  std::optional<nn::ContextParallelLayout> cp_layout;
  std::unique_ptr<models::LanguageModel> model;
  FsdpOptions fsdp_options;
  std::unique_ptr<ShardedModel> sharded;
  std::unique_ptr<Optimizer> optimizer;
  LrSchedule schedule;
  int64_t n_params = 0;
  double flops_per_token = 0;
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
  std::unique_ptr<UpdateNorms> update_norms;   // logger.log_update_norms
  std::unique_ptr<MoeStep> moe;                // the MoE layers' step accounting
  std::vector<StepMetrics> history;            // what the loss picture draws
  // The tokenizer of the end-of-run sample; null when no sample is printed (not asked for,
  // or the model's vocabulary cannot hold the tokenizer's: a finished run never fails there).
  std::unique_ptr<data::Gpt2Tokenizer> sample_tokenizer;
  int64_t step = 0;  // optimizer steps completed
  std::unique_ptr<StepClock> clock;
  // train.cuda_graphs: runs each micro-batch's forward and backward eagerly or as a graph
  // replay (null when off). Declared last: destroyed before the model and the context.
  std::unique_ptr<MicroBatchGraph> graphs;

  // The expert-parallel collectives so far (zeros without expert parallelism).
  ExpertCounts expert_counts() {
    if (!ep_group) return {};
    return {comms->axis(MeshAxis::ep).counts().all_to_all,
            comms->all_gather_comm(DpGroup::expert_dp_shard).counts().all_gather,
            comms->reduce_scatter_comm(DpGroup::expert_dp_shard).counts().reduce_scatter};
  }

  // Set-up, in order.
  void setup_world();
  // ConfigError on every rank if the ranks were started with different recipes, naming the
  // first key that differs (a different lr would train silently; a different train_iters
  // would end in a mismatched collective).
  void check_same_recipe_on_every_rank();
  void setup_model_and_sharding();
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
  // Whether any rank was asked to stop (collective; every rank calls it at the same point).
  bool stop_agreed();
  // logger.samples_file: the global batch the next step reads (rank 0 writes it).
  void log_samples();
  double evaluate();
  // The step line, the metrics record and the picture's history (logged steps only).
  void log_step(const StepMetrics& m, bool evaluated);
  std::string sample_text();
};

namespace {

// Runs `body`; if it throws once the world exists, the world's communicators are aborted
// first, so that no destructor waits on a collective the failed rank will never join and
// the other ranks' watchdogs (or mpirun) end the job instead of a hang.
template <typename F>
auto abort_world_on_error(const std::unique_ptr<World>& world, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    if (world) world->abort(str_cat("rank ", world->rank(), " failed: ", e.what()));
    throw;
  }
}

}  // namespace

Trainer::Trainer(const Recipe& recipe, const TrainerOptions& options) : s_(std::make_unique<State>()) {
  s_->recipe = recipe;
  s_->options = options;
  abort_world_on_error(s_->world, [&] {
    s_->setup_world();
    s_->setup_model_and_sharding();
    s_->setup_data();
    s_->setup_output();
    s_->print_startup_report();
  });
}

Trainer::~Trainer() = default;

const Recipe& Trainer::recipe() const { return s_->recipe; }
int Trainer::rank() const { return s_->world->rank(); }
int Trainer::world_size() const { return s_->world->size(); }

// ---------------------------------------------------------------- set-up

void Trainer::State::setup_world() {
  // Device and world: the recipe's "auto" choices settle on what this process can use.
  recipe.resolve_device(cuda_device_count() > 0);
  // Everything the recipe says about the launch is checked before the world starts, so a
  // bad recipe ends every rank with a ConfigError, not one rank inside a collective.
  LaunchInfo launch = parse_launch_env(process_environment());
  if (options.alone) launch = launch_alone(launch);
  recipe.resolve_world(launch.size);
  const Mesh planned(mesh_sizes_of(recipe), launch.size);
  (void)model_config_of(recipe);
  (void)fsdp_options_of(recipe);
  (void)optimizer_config_of(recipe);
  const int planned_dp = recipe.dist.dp_outer * recipe.dist.dp_shard;
  const CudaGraphPlan graph_plan =
      CudaGraphPlan::of(recipe, planned_dp, recipe.grad_accum_steps(planned_dp),
                        planned_dp > 1 && !options.skip_collectives);
  WorldOptions wo;
  wo.backend = device_type_of(recipe) == DeviceType::CUDA ? Backend::Nccl : Backend::Mpi;
  wo.timeout = std::chrono::milliseconds(int64_t(recipe.dist.distributed_timeout_minutes * 60000));
  wo.print_summary = options.out != nullptr;
  wo.on_failure = options.on_comm_failure;
  wo.alone = options.alone;
  world = std::make_unique<World>(launch, wo);
  FSDP_ASSERT(world->size() == launch.size);
  mesh = std::make_unique<Mesh>(mesh_sizes_of(recipe), world->size());
  comms = std::make_unique<MeshCommunicators>(*world, *mesh);
  ctx = std::make_unique<Context>(world->device());
  check_same_recipe_on_every_rank();
  clock = std::make_unique<StepClock>(*ctx);
  const std::vector<int> dp_group = mesh->dp_group(world->rank());
  dp_size = int(dp_group.size());
  dp_rank = int(std::find(dp_group.begin(), dp_group.end(), world->rank()) - dp_group.begin());
  accum = recipe.grad_accum_steps(dp_size);
  if (graph_plan.enabled()) {
    FSDP_ASSERT(dp_size == planned_dp, "data-parallel size ", dp_size, " differs from the planned ", planned_dp);
    // The compute stream waits for the reduce stream (no_shard: gradient accumulation
    // there); the sharded model exists by the time a micro-batch runs.
    graphs = std::make_unique<MicroBatchGraph>(*ctx, graph_plan, [this] { sharded->finish_grad_sync(); });
  }
}

void Trainer::State::check_same_recipe_on_every_rank() {
  // Everything that decides what is computed must agree; file paths may differ (a node's
  // local copy of the data, its own mount point).
  static const std::vector<std::string> kPaths = {
      "tokenizer.vocab_file", "tokenizer.merges_file", "dataset.train_path", "dataset.val_path",
      "checkpoint.save", "checkpoint.load", "run.output_dir"};
  const std::vector<std::string> all =
      checkpoint::all_gather_strings(*ctx, &world->comm(), recipe.to_json_string());
  const Recipe first = parse_recipe(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::string where = first_difference(first, parse_recipe(all[r]), kPaths);
    FSDP_CHECK(where.empty(), ConfigError, "the ranks were started with different recipes: rank 0 "
               "and rank ", r, " differ first at ", where,
               "; launch every rank with the same --config and overrides");
  }
}

void Trainer::State::setup_model_and_sharding() {
  // The model as specs; fully_shard materializes and initializes only this rank's shards.
  model_config = model_config_of(recipe);
  model = models::build_model(model_config);
  n_params = model->num_parameters();  // the whole model's, before any split
  if (mesh->size(MeshAxis::tp) > 1) {
    // Tensor parallelism slices the specs first; FSDP then shards this rank's slices.
    tp_group = std::make_unique<CommunicatorTensorParallelGroup>(comms->axis(MeshAxis::tp));
    apply_tensor_parallel(*model, model->vocabulary_tables(), *tp_group,
                          recipe.model.sequence_parallel);
  }
  if (mesh->size(MeshAxis::cp) > 1) {
    cp_group = std::make_unique<CommunicatorTensorParallelGroup>(comms->axis(MeshAxis::cp));
    apply_context_parallel(*model, model->vocabulary_tables(), *cp_group, recipe.model.seq_length,
                           context_parallel_comm(recipe.model.cp_comm_type));
    cp_layout = nn::ContextParallelLayout::make(recipe.model.seq_length, cp_group->size(),
                                                cp_group->rank());
  }
  if (mesh->size(MeshAxis::ep) > 1) {
    // Each expert-parallel rank keeps its part of every MoE layer's experts; FSDP shards
    // them over the ranks that hold the same ones.
    ep_group = std::make_unique<CommunicatorExpertParallelGroup>(comms->axis(MeshAxis::ep));
    apply_expert_parallel(*model, *ep_group);
  }
  models::set_activation_recompute(*model, recompute_of(recipe));
  // A token runs through k of each MoE layer's E experts: the FLOPs count active parameters.
  flops_per_token = train::flops_per_token(
      n_params - int64_t(model_config.inactive_parameters_per_token()),
      int(model_config.n_layer), int(model_config.d_model), int(model_config.seq_len));
  moe = std::make_unique<MoeStep>(*model, recipe.model.moe_router_bias_update_rate);
  // A run whose predicted memory exceeds the device is refused before anything is allocated.
  check_memory_fits(predict_memory(recipe, *model, *mesh), ctx->device(), world->local_size());
  fsdp_options = fsdp_options_of(recipe);
  fsdp_options.skip_collectives = options.skip_collectives;
  fsdp_options.time_collectives = options.time_collectives;
  sharded = fully_shard(*ctx, *model, data_parallel_groups(*comms, fsdp_options.strategy), fsdp_options);
  OptimizerConfig optimizer_config = optimizer_config_of(recipe);
  // CPU offload: the ranks on this host share its cores.
  optimizer_config.offload.threads = host_threads_per_process(world->local_size());
  if (recipe.optimizer.overlap_cpu_offload) {
    // The host updates the ranges in the order the next forward gathers them, and each
    // unit's gather waits for its own ranges only.
    optimizer_config.offload.overlap = true;
    optimizer_config.offload.order = sharded->forward_range_order();
  }
  optimizer = std::make_unique<Optimizer>(*ctx, sharded->optimizer_ranges(), optimizer_config);
  if (recipe.optimizer.overlap_cpu_offload) {
    Optimizer* opt = optimizer.get();
    // A unit's ranges are consecutive in the update order: the last one's event covers all.
    sharded->set_weights_fence([opt](size_t first, size_t last, bool block, Event* ready) {
      (void)first;
      return opt->range_ready(last - 1, block, ready);
    });
  }
  schedule = LrSchedule::from_recipe(recipe);
  if (recipe.logger.log_update_norms) update_norms = std::make_unique<UpdateNorms>(*ctx, *sharded);
}

void Trainer::State::setup_data() {
  // This rank's part of every global batch.
  const int64_t B = recipe.train.micro_batch_size, T = recipe.model.seq_length;
  const uint64_t data_seed = uint64_t(recipe.dataset.seed);
  train_data = std::make_unique<data::DataLoader>(train_data_of(recipe), B, T, dp_rank, dp_size, data_seed);
  train_data->vocab_check(recipe.model.vocab_size);
  bool has_val = false;
  const data::DataSpec val_spec = val_data_of(recipe, &has_val);
  if (has_val && recipe.train.eval_iters > 0) {
    val_data = std::make_unique<data::DataLoader>(val_spec, B, T, dp_rank, dp_size, data_seed);
    val_data->vocab_check(recipe.model.vocab_size);
  }
  tokens = std::make_unique<TokenUploader>(*ctx);
}

void Trainer::State::setup_output() {
  // Resuming restores the weights, the optimizer, the step and the data position.
  const ShardingStrategy strategy = fsdp_options.strategy;
  CheckpointedParts parts{ctx.get(), &world->comm(), mesh.get(), data_parallel_groups(*comms, strategy),
                          sharded.get(), optimizer.get(), train_data.get()};
  checkpoints = std::make_unique<RunCheckpoints>(recipe, parts, [this](const std::string& l) { print(l); });
  checkpoints->check_save_directory();
  std::optional<int64_t> resumed;
  if (options.resume) resumed = checkpoints->resume();
  // The expert biases are training state that checkpoints do not hold yet: a resume would
  // restart them at zero and leave the run's curve without saying so.
  FSDP_CHECK(!resumed || !model_config.moe_router_enable_expert_bias, ConfigError,
             "resuming with 'model.moe_router_enable_expert_bias' is not supported yet: the "
             "expert biases are not in checkpoints (set checkpoint.load=null to start fresh)");
  if (resumed) step = *resumed;
  // The resolved recipe, and the step logs (a resumed run keeps their earlier lines).
  if (world->rank() == 0) {
    std::filesystem::create_directories(recipe.run.output_dir);
    recipe.write_resolved(recipe.run.output_dir + "/run_config.json");
    auto log_file = [&](const std::optional<std::string>& name) {
      return name ? std::make_unique<StepLogWriter>(recipe.run.output_dir + "/" + *name, resumed) : nullptr;
    };
    metrics = log_file(recipe.logger.metrics_file);
    if (metrics && resumed) history = read_metrics_file(metrics->path());
    samples_log = log_file(recipe.logger.samples_file);
    if (recipe.logger.tensorboard_dir)
      tensorboard = std::make_unique<TensorBoardWriter>(*recipe.logger.tensorboard_dir, recipe.run.name);
  }
  prepare_sample();
}

void Trainer::State::print_startup_report() const {
  const int64_t B = recipe.train.micro_batch_size, T = recipe.model.seq_length;
  print(str_cat("model: ", model_config.str(), ", ", n_params, " parameters"));
  print(str_cat("training: ", recipe.train.train_iters, " steps of ", recipe.train.global_batch_size,
                " x ", T, " tokens (", accum, " micro-batches of ", B, " per rank, ", dp_size,
                " data-parallel ranks", tp_group ? str_cat(" x ", tp_group->size(), " tensor-parallel") : "",
                ep_group ? str_cat(", experts over ", ep_group->size(), " expert-parallel ranks") : "",
                "), ", strategy_name(fsdp_options.strategy), ", ",
                recipe.mixed_precision.compute_dtype, " compute"));
  if (graphs)
    print(str_cat("cuda graphs: one micro-batch's forward+backward captured after an eager warm-up and "
                  "replayed for ", graphs->plan().graphs_last() ? "every later micro-batch"
                                                                : "the micro-batches before each step's last"));
  const MemoryBreakdown mem = sharded->memory();
  const size_t opt_bytes = optimizer->state_bytes();
  const int64_t act = activation_bytes_estimate(model_config, B, T, fsdp_options.compute_dtype,
                                                recompute_of(recipe),
                                                recipe.model.tensor_model_parallel_size,
                                            recipe.model.sequence_parallel);
  print(sharded->memory_report());
  print(str_cat("  optimizer state  ", format_bytes(int64_t(opt_bytes)),
                optimizer->offloaded()
                    ? str_cat(" (", format_bytes(int64_t(optimizer->host_state_bytes())),
                              " in pinned host memory: cpu offload, AdamW on ",
                              optimizer->offload()->threads(), " host threads, ",
                              format_bytes(int64_t(optimizer->offload()->staging_bytes())),
                              " of it staging)")
                    : std::string(),
                "\n  activations      ", format_bytes(act), " (estimate)\n  predicted peak   ",
                format_bytes(int64_t(mem.total() + opt_bytes) + act)));
}

void Trainer::State::prepare_sample() {
  if (!options.print_sample) return;
  // Decided the same way on every rank, before training, so that every rank generates or none.
  std::string why_not;
  if (tp_group || cp_group || ep_group) {
    print("no text sample at the end of the run: generation does not run tensor-, context- "
          "or expert-parallel models yet");
    return;
  }
  try {
    auto tok = std::make_unique<data::Gpt2Tokenizer>(data::locate_asset(recipe.tokenizer.vocab_file),
                                                     data::locate_asset(recipe.tokenizer.merges_file));
    if (tok->vocab_size() > recipe.model.vocab_size)
      why_not = str_cat("model.vocab_size ", recipe.model.vocab_size, " is smaller than the tokenizer's ",
                        tok->vocab_size());
    else
      sample_tokenizer = std::move(tok);
  } catch (const Error& e) {
    why_not = e.what();
  }
  if (!why_not.empty()) print(str_cat("no text sample at the end of the run: ", why_not));
}

// ---------------------------------------------------------------- one step

std::vector<double> Trainer::State::sum_over_ranks(const std::vector<double>& values) {
  Tensor t = ops::from_host<double>(*ctx, values, Shape{int64_t(values.size())});
  if (world->size() > 1) world->comm().all_reduce(t, ReduceOp::Sum, ctx->stream());
  return ops::to_vector<double>(*ctx, t);
}

bool Trainer::State::stop_agreed() {
  const bool mine = options.stop_requested && options.stop_requested();
  return sum_over_ranks({mine ? 1.0 : 0.0})[0] > 0;
}

std::optional<double> Trainer::State::train_step(double lr, double* grad_norm) {
  clock->start_step();
  const int64_t B = recipe.train.micro_batch_size, T = recipe.model.seq_length;
  const int64_t local_T = cp_layout ? cp_layout->local_seq() : T;
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T)), x_local, y_local;
  Tensor loss_sum = ops::zeros(*ctx, Shape{}, ctx->is_cuda() ? DType::f32 : DType::f64);
  sharded->start_step();
  moe->start_step();
  clock->start_micro_batches();
  for (int64_t m = 0; m < accum; ++m) {
    sharded->start_micro_batch(m == accum - 1);
    train_data->next(x.data(), y.data());
    Tensor idx = tokens->upload(size_t(2 * m), local_tokens(x, x_local), B, local_T);
    Tensor tgt = tokens->upload(size_t(2 * m + 1), local_tokens(y, y_local), B, local_T);
    // One micro-batch's forward and backward; with train.cuda_graphs it is captured once and
    // replayed (the autograd graph lives inside, so nothing it holds escapes but the loss).
    auto body = [&](const Tensor& inputs, const Tensor& targets) {
      autograd::Graph g(*ctx);
      Tensor loss;
      {
        NvtxRange r("forward");
        // Under context parallelism the loss of this rank's tokens, weighted as the
        // gradient reduction over dp x cp needs: its mean times cp, summed over the group,
        // is the mean over every token of the sequences.
        loss = model->forward(g, inputs, targets, B * local_T);
      }
      NvtxRange r("backward");
      g.backward(loss);
      return loss;
    };
    const Tensor loss = graphs ? graphs->run(m == accum - 1, idx, tgt, body) : body(idx, tgt);
    ops::axpby(*ctx, loss_sum, 1.0, loss, 1.0);
    // A stop request inside a long step: between micro-batches, every rank at the same ones.
    const int64_t poll_every = ctx->is_cuda() ? 8 : 1;
    if (options.stop_requested && m + 1 < accum && (m + 1) % poll_every == 0 && stop_agreed()) {
      sharded->finish_grad_sync();
      return std::nullopt;
    }
  }
  clock->micro_batches_queued();
  NvtxRange r("optimizer");
  sharded->finish_grad_sync();
  const double norm = sharded->grad_norm();
  FSDP_CHECK(std::isfinite(norm), Error, "training diverged at step ", step + 1,
             ": the gradient norm is ", norm, " (lower optimizer.lr or check the data)");
  const double clip = clip_coefficient(norm, recipe.optimizer.clip_grad);
  clock->start_optimizer();
  if (update_norms) update_norms->before_step();
  optimizer->step(lr, sharded->grad_multiplier() * clip);
  sharded->install_weights();
  clock->end_optimizer();
  *grad_norm = norm;
  clock->step_issued();
  return ops::item(*ctx, loss_sum);
}

void Trainer::State::log_samples() {
  if (!samples_log) return;
  // On rank 0 the loader's position is where this step's global batch starts.
  const uint64_t first = train_data->position();
  const uint64_t count = uint64_t(recipe.train.global_batch_size);
  nlohmann::ordered_json samples = nlohmann::ordered_json::array();
  for (const data::DataLoader::SampleRef& r : train_data->sample_refs(first, count)) {
    const std::optional<uint64_t> offset = train_data->source().stream_offset(r.epoch, r.index);
    samples.push_back({r.epoch, r.index, offset ? nlohmann::ordered_json(*offset) : nullptr});
  }
  nlohmann::ordered_json line;
  line["step"] = step + 1;
  line["first_sample"] = first;
  line["samples"] = samples;
  samples_log->write_line(line.dump());
}

double Trainer::State::evaluate() {
  NvtxRange r("evaluate");
  const int64_t B = recipe.train.micro_batch_size, T = recipe.model.seq_length;
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T)), x_local, y_local;
  val_data->seek(0);  // the same batches at every evaluation
  // eval_iters global batches, as Megatron counts them: the same samples for any number of
  // data-parallel ranks, so the validation loss does not depend on it either.
  const int64_t micro_batches = recipe.train.eval_iters * accum;
  double sum = 0;
  for (int64_t i = 0; i < micro_batches; ++i) {
    val_data->next(x.data(), y.data());
    autograd::Graph g(*ctx);
    autograd::NoGradGuard no_grad(g);
    const int64_t local_T = cp_layout ? cp_layout->local_seq() : T;
    Tensor loss = model->forward(
        g, ops::from_host<int32_t>(*ctx, local_tokens(x, x_local), Shape{B, local_T}),
        ops::from_host<int32_t>(*ctx, local_tokens(y, y_local), Shape{B, local_T}), B * local_T);
    sum += ops::item(*ctx, loss);
  }
  return sum_over_ranks({sum})[0] / double(micro_batches * world->size());
}

void Trainer::State::log_step(const StepMetrics& m, bool evaluated) {
  const int64_t every = std::max<int64_t>(1, recipe.logger.log_interval);
  const int64_t total = recipe.train.train_iters;
  if (m.step % every != 0 && m.step != 1 && m.step != total && !evaluated) return;
  // Time left: the mean wall time per step so far in this process (evaluation and saves
  // included, as they will recur) times the steps to go.
  RunClock clock;
  clock.elapsed_s = seconds_since(loop_start);
  if (m.step > loop_first_step && m.step < total)
    clock.eta_s = clock.elapsed_s / double(m.step - loop_first_step) * double(total - m.step);
  print(format_step_line(m, total, stdout_is_terminal() && options.out == stdout, clock));
  history.push_back(m);
  if (metrics) metrics->write(m);
  if (tensorboard) {
    tensorboard->add_step_metrics(m);
    tensorboard->flush();
  }
}

std::string Trainer::State::sample_text() {
  // Every rank generates (a sharded model gathers its weights collectively); rank 0 prints.
  data::Gpt2Tokenizer& tok = *sample_tokenizer;
  std::vector<int32_t> prompt = tok.encode(options.sample_prompt);
  models::SampleOptions so;
  so.n_tokens = options.sample_tokens;
  so.temperature = 0.8;
  so.top_k = 40;
  so.seed = uint64_t(recipe.run.seed);
  std::vector<int32_t> out = models::generate(*ctx, *model, prompt, so);
  return options.sample_prompt + tok.decode(out);
}

// ---------------------------------------------------------------- the loop

TrainResult Trainer::run() {
  return abort_world_on_error(s_->world, [&] { return run_steps(); });
}

TrainResult Trainer::run_steps() {
  State& s = *s_;
  const int64_t total = s.recipe.train.train_iters;
  TrainResult result;
  result.first_step = s.step;
  RunStats stats(*s.ctx, s.step, s.options.warmup_steps, s.options.profile_timed_steps,
                 s.recipe.train.global_batch_size * s.recipe.model.seq_length,
                 s.flops_per_token, s.world->size());
  s.loop_start = Clock::now();
  s.loop_first_step = s.step;
  const ExpertCounts experts_before = s.expert_counts();
  while (s.step < total) {
    s.world->set_step(s.step + 1);
    stats.start_step(s.step + 1);
    const auto t0 = Clock::now();
    const double lr = s.schedule.lr_at(s.step);
    double norm = 0;
    s.log_samples();
    const uint64_t step_start = s.train_data->position();
    const std::optional<double> local_loss = s.train_step(lr, &norm);
    if (!local_loss) {
      // Stopped between micro-batches: the step is dropped and its data will be read again.
      s.train_data->seek(step_start);
      s.print(str_cat("stop requested: ending during step ", s.step + 1, ", which is dropped"));
      s.checkpoints->after_step(s.step, /*final=*/true);
      result.stopped = true;
      break;
    }
    // One small all-reduce carries the losses and any rank's stop request.
    const bool stop_here = s.options.stop_requested && s.options.stop_requested();
    // The MoE layers' totals ride along (empty for a dense model).
    std::vector<double> local = {*local_loss, stop_here ? 1.0 : 0.0};
    if (s.moe->active()) {
      const std::vector<double> moe_local = s.moe->local_values();
      local.insert(local.end(), moe_local.begin(), moe_local.end());
    }
    const std::vector<double> summed = s.sum_over_ranks(local);
    // Every rank's micro-batch losses (the tensor-parallel ranks of one data-parallel rank
    // compute the same ones).
    const double loss = summed[0] / double(s.accum * s.world->size());
    const double dt = seconds_since(t0);
    s.step++;
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
    stats.end_step(s.step, dt, s.clock->times(), s.sharded->take_collective_times());

    StepMetrics m = stats.metrics(s.step, loss, lr, norm, dt);
    if (s.update_norms) m.update_norms = s.update_norms->after_step();
    if (s.moe->active())
      s.moe->finish_step(*s.ctx, std::vector<double>(summed.begin() + 2, summed.end()),
                         double(s.accum * s.world->size()), m);
    if (m.moe_aux_loss) {
      result.moe_aux_losses.push_back(*m.moe_aux_loss);
      result.moe_z_losses.push_back(*m.moe_z_loss);
      result.moe_max_loads.push_back(*m.moe_max_load);
    }
    const bool eval_now = s.val_data && s.recipe.train.eval_interval > 0 &&
                          (s.step % s.recipe.train.eval_interval == 0 || s.step == total);
    if (eval_now) {
      m.val_loss = s.evaluate();
      result.val_losses.push_back(*m.val_loss);
    }
    s.log_step(m, eval_now);
    // Saves at intervals, after the last step, and when a stop was requested (every rank
    // agreed on that through the all-reduce above).
    s.checkpoints->after_step(s.step, summed[1] > 0 || s.step == total);
    if (summed[1] > 0) {
      s.print(str_cat("stop requested: ending after step ", s.step));
      result.stopped = true;
      break;
    }
  }

  result.steps = s.step;
  result.cuda_graph_replays = s.graphs ? s.graphs->replays() : 0;
  const ExpertCounts experts_after = s.expert_counts();
  result.expert_all_to_alls = experts_after.all_to_alls - experts_before.all_to_alls;
  result.expert_all_gathers = experts_after.all_gathers - experts_before.all_gathers;
  result.expert_reduce_scatters = experts_after.reduce_scatters - experts_before.reduce_scatters;
  stats.finish(result);
  if (s.world->rank() == 0 && !s.history.empty()) {
    const std::string chart = s.recipe.run.output_dir + "/loss.svg";
    write_loss_chart(chart, loss_series(s.history), s.recipe.run.name);
    s.print(str_cat("loss picture: ", chart));
  }
  if (s.sample_tokenizer && !result.stopped) {
    result.sample = s.sample_text();
    s.print(str_cat("sample: ", result.sample));
  }
  return result;
}

}  // namespace fsdp::train
