// Trainer: set-up (world, model, sharding, optimizer, data, output) and the training loop.
#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

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
#include "runtime/fsdp/memory.h"
#include "runtime/train/checkpointing.h"
#include "runtime/train/cuda_graph.h"
#include "runtime/train/metrics.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/plot.h"
#include "runtime/train/schedule.h"
#include "runtime/train/trainer_setup.h"
#include "runtime/train/update_norms.h"

namespace fsdp::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// Members are destroyed in reverse order: the sharded model (its hooks) before the model,
// tensors before their context, communicators before the world.
struct Trainer::State {
  Recipe recipe;
  TrainerOptions options;
  std::unique_ptr<World> world;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<MeshCommunicators> comms;
  std::unique_ptr<Context> ctx;
  models::ModelConfig model_config;
  std::unique_ptr<models::LanguageModel> model;
  FsdpOptions fsdp_options;
  std::unique_ptr<ShardedModel> sharded;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<data::DataLoader> train_data, val_data;
  std::unique_ptr<StepLogWriter> metrics;
  std::unique_ptr<StepLogWriter> samples_log;  // logger.samples_file (rank 0)
  std::unique_ptr<UpdateNorms> update_norms;   // logger.log_update_norms
  // The tokenizer of the end-of-run sample; null when no sample is printed (not asked for,
  // or the model's vocabulary cannot hold the tokenizer's: a finished run never fails there).
  std::unique_ptr<data::Gpt2Tokenizer> sample_tokenizer;
  void prepare_sample();
  std::unique_ptr<RunCheckpoints> checkpoints;
  std::vector<StepMetrics> history;
  LrSchedule schedule;
  int dp_rank = 0, dp_size = 1;
  int64_t accum = 1;  // micro-batches per rank per step
  int64_t step = 0;   // optimizer steps completed
  int64_t n_params = 0;
  // Timing events around the optimizer step (CUDA; host clock on the CPU).
  Event optimizer_start, optimizer_end;
  // Around the forward and backward of all micro-batches (CUDA): with queue_host_s they show
  // whether the device waited for the host to queue work.
  Event micro_batches_start, micro_batches_end;
  // Page-locked staging of each micro-batch's tokens (inputs, targets), and the event after
  // each one's upload: a copy from pageable memory could make the host wait for the device,
  // and then the device would wait for the host to queue the next micro-batch.
  std::vector<Tensor> token_staging;
  std::vector<Event> tokens_uploaded;
  // The (B, T) tokens of micro-batch slot `slot`, on the device, uploaded asynchronously.
  Tensor upload_tokens(size_t slot, const std::vector<int32_t>& tokens, int64_t B, int64_t T);
  double optimizer_host_s = 0;
  double issue_host_s = 0;  // the last step's host time up to its wait for the loss
  double queue_host_s = 0;  // the last step's host time to queue its forwards and backwards
  // The device time of the last step's forwards and backwards; call after it synchronized.
  double last_forward_backward_s() const {
    if (ctx->is_cuda()) return Event::elapsed_ms(micro_batches_start, micro_batches_end) / 1000.0;
    return queue_host_s;
  }
  // The last step's optimizer time; call after the step has synchronized.
  double last_optimizer_s() const {
    if (ctx->is_cuda()) return Event::elapsed_ms(optimizer_start, optimizer_end) / 1000.0;
    return optimizer_host_s;
  }
  double flops_per_token = 0;
  // train.cuda_graphs: runs each micro-batch's forward and backward eagerly or as a graph
  // replay (null when off). Declared last: destroyed before the model and the context.
  std::unique_ptr<MicroBatchGraph> graphs;

  void setup();
  void print(const std::string& line) const {
    if (world->rank() == 0 && options.out) {
      std::fprintf(options.out, "%s\n", line.c_str());
      std::fflush(options.out);
    }
  }
  // Sums `values` over every rank (tiny host vectors: losses, flags).
  std::vector<double> sum_over_ranks(const std::vector<double>& values);
  double train_step(double lr, double* grad_norm);
  // logger.samples_file: the global batch the next step reads (rank 0 writes it).
  void log_samples();
  double evaluate();
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
  abort_world_on_error(s_->world, [&] { s_->setup(); });
}

Trainer::~Trainer() = default;

const Recipe& Trainer::recipe() const { return s_->recipe; }
int Trainer::rank() const { return s_->world->rank(); }
int Trainer::world_size() const { return s_->world->size(); }

void Trainer::State::setup() {
  // Device and world: the recipe's "auto" choices settle on what this process can use.
  recipe.resolve_device(cuda_device_count() > 0);
  // Everything the recipe says about the launch is checked before the world starts, so a
  // bad recipe ends every rank with a ConfigError, not one rank inside a collective.
  const LaunchInfo launch = parse_launch_env(process_environment());
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
  wo.backend = recipe.dist.device == "cuda" ? Backend::Nccl : Backend::Mpi;
  wo.timeout = std::chrono::milliseconds(int64_t(recipe.dist.distributed_timeout_minutes * 60000));
  wo.print_summary = options.out != nullptr;
  wo.on_failure = options.on_comm_failure;
  world = std::make_unique<World>(launch, wo);
  FSDP_ASSERT(world->size() == launch.size);
  mesh = std::make_unique<Mesh>(mesh_sizes_of(recipe), world->size());
  comms = std::make_unique<MeshCommunicators>(*world, *mesh);
  ctx = std::make_unique<Context>(world->device());
  if (ctx->is_cuda()) {
    optimizer_start = Event::create(ctx->device(), /*enable_timing=*/true);
    optimizer_end = Event::create(ctx->device(), /*enable_timing=*/true);
    micro_batches_start = Event::create(ctx->device(), /*enable_timing=*/true);
    micro_batches_end = Event::create(ctx->device(), /*enable_timing=*/true);
  }
  const std::vector<int> dp_group = mesh->dp_group(world->rank());
  dp_size = int(dp_group.size());
  dp_rank = int(std::find(dp_group.begin(), dp_group.end(), world->rank()) - dp_group.begin());
  accum = recipe.grad_accum_steps(dp_size);

  // Model (specs), sharding (only this rank's shards are allocated and initialized).
  model_config = model_config_of(recipe);
  model = models::build_model(model_config);
  models::set_activation_recompute(*model, recipe.model.activation_recompute);
  n_params = model->num_parameters();
  flops_per_token = train::flops_per_token(n_params, int(model_config.n_layer),
                                           int(model_config.d_model), int(model_config.seq_len));
  fsdp_options = fsdp_options_of(recipe);
  fsdp_options.skip_collectives = options.skip_collectives;
  fsdp_options.time_collectives = options.time_collectives;
  const ShardingStrategy strategy = fsdp_options.strategy;
  sharded = fully_shard(*ctx, *model, data_parallel_groups(*comms, strategy), fsdp_options);
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
  if (graph_plan.enabled()) {
    FSDP_ASSERT(dp_size == planned_dp, "data-parallel size ", dp_size, " differs from the planned ", planned_dp);
    // The compute stream waits for the reduce stream (no_shard: gradient accumulation there).
    graphs = std::make_unique<MicroBatchGraph>(*ctx, graph_plan, [this] { sharded->finish_grad_sync(); });
  }
  schedule = LrSchedule::from_recipe(recipe);

  // Data: this rank's part of every global batch.
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

  // Checkpoints: resuming restores the weights, the optimizer, the step and the data position.
  CheckpointedParts parts{ctx.get(), &world->comm(), mesh.get(), data_parallel_groups(*comms, strategy),
                          sharded.get(), optimizer.get(), train_data.get()};
  checkpoints = std::make_unique<RunCheckpoints>(recipe, parts, [this](const std::string& l) { print(l); });
  std::optional<int64_t> resumed;
  if (options.resume) resumed = checkpoints->resume();
  if (resumed) step = *resumed;

  // Output: the resolved recipe, and the metrics file (a resumed run keeps its earlier lines).
  if (world->rank() == 0) {
    std::filesystem::create_directories(recipe.run.output_dir);
    recipe.write_resolved(recipe.run.output_dir + "/run_config.json");
    if (recipe.logger.metrics_file)
      metrics = std::make_unique<StepLogWriter>(recipe.run.output_dir + "/" + *recipe.logger.metrics_file, resumed);
    if (metrics && resumed) history = read_metrics_file(metrics->path());
    if (recipe.logger.samples_file)
      samples_log = std::make_unique<StepLogWriter>(recipe.run.output_dir + "/" + *recipe.logger.samples_file, resumed);
  }
  if (recipe.logger.log_update_norms) update_norms = std::make_unique<UpdateNorms>(*ctx, *sharded);
  prepare_sample();

  print(str_cat("model: ", model_config.str(), ", ", n_params, " parameters"));
  print(str_cat("training: ", recipe.train.train_iters, " steps of ", recipe.train.global_batch_size,
                " x ", T, " tokens (", accum, " micro-batches of ", B, " per rank, ", dp_size,
                " data-parallel ranks), ", strategy_name(strategy), ", ",
                recipe.mixed_precision.compute_dtype, " compute"));
  if (graphs)
    print(str_cat("cuda graphs: one micro-batch's forward+backward captured after an eager warm-up and "
                  "replayed for ", graphs->plan().graphs_last() ? "every later micro-batch"
                                                                : "the micro-batches before each step's last"));
  const MemoryBreakdown mem = sharded->memory();
  const size_t opt_bytes = optimizer->state_bytes();
  const int64_t act = activation_bytes_estimate(model_config, B, T, fsdp_options.compute_dtype,
                                                recipe.model.activation_recompute);
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

std::vector<double> Trainer::State::sum_over_ranks(const std::vector<double>& values) {
  Tensor t = ops::from_host<double>(*ctx, values, Shape{int64_t(values.size())});
  if (world->size() > 1) world->comm().all_reduce(t, ReduceOp::Sum, ctx->stream());
  return ops::to_vector<double>(*ctx, t);
}

Tensor Trainer::State::upload_tokens(size_t slot, const std::vector<int32_t>& tokens, int64_t B,
                                     int64_t T) {
  if (ctx->device().is_cpu()) return ops::from_host<int32_t>(*ctx, tokens, Shape{B, T});
  if (token_staging.size() <= slot) {
    token_staging.resize(slot + 1);
    tokens_uploaded.resize(slot + 1);
  }
  Tensor& staged = token_staging[slot];
  if (!staged.defined() || staged.numel() != B * T)
    staged = ctx->empty_pinned(Shape{B, T}, DType::i32);
  tokens_uploaded[slot].synchronize();  // the slot's previous upload has left (long ago)
  std::copy(tokens.begin(), tokens.end(), staged.data<int32_t>());
  Tensor on_device = ctx->empty(Shape{B, T}, DType::i32);
  copy_bytes_async(on_device, staged, ctx->stream());
  tokens_uploaded[slot].record(ctx->stream());
  return on_device;
}

double Trainer::State::train_step(double lr, double* grad_norm) {
  const auto t_issue = Clock::now();
  const int64_t B = recipe.train.micro_batch_size, T = recipe.model.seq_length;
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
  Tensor loss_sum = ops::zeros(*ctx, Shape{}, ctx->is_cuda() ? DType::f32 : DType::f64);
  sharded->start_step();
  micro_batches_start.record(ctx->stream());
  for (int64_t m = 0; m < accum; ++m) {
    sharded->start_micro_batch(m == accum - 1);
    train_data->next(x.data(), y.data());
    Tensor idx = upload_tokens(size_t(2 * m), x, B, T);
    Tensor tgt = upload_tokens(size_t(2 * m + 1), y, B, T);
    // One micro-batch's forward and backward; with train.cuda_graphs it is captured once and
    // replayed (the autograd graph lives inside, so nothing it holds escapes but the loss).
    auto body = [&](const Tensor& tokens, const Tensor& targets) {
      autograd::Graph g(*ctx);
      Tensor loss;
      {
        NvtxRange r("forward");
        loss = model->forward(g, tokens, targets, B * T);
      }
      NvtxRange r("backward");
      g.backward(loss);
      return loss;
    };
    const Tensor loss = graphs ? graphs->run(m == accum - 1, idx, tgt, body) : body(idx, tgt);
    ops::axpby(*ctx, loss_sum, 1.0, loss, 1.0);
  }
  micro_batches_end.record(ctx->stream());
  queue_host_s = seconds_since(t_issue);
  NvtxRange r("optimizer");
  sharded->finish_grad_sync();
  const double norm = sharded->grad_norm();
  FSDP_CHECK(std::isfinite(norm), Error, "training diverged at step ", step + 1,
             ": the gradient norm is ", norm, " (lower optimizer.lr or check the data)");
  const double clip = clip_coefficient(norm, recipe.optimizer.clip_grad);
  const auto t_optimizer = Clock::now();
  optimizer_start.record(ctx->stream());
  if (update_norms) update_norms->before_step();
  optimizer->step(lr, sharded->grad_multiplier() * clip);
  sharded->install_weights();
  optimizer_end.record(ctx->stream());
  optimizer_host_s = seconds_since(t_optimizer);
  *grad_norm = norm;
  issue_host_s = seconds_since(t_issue);
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
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
  val_data->seek(0);  // the same batches at every evaluation
  // eval_iters global batches, as Megatron counts them: the same samples for any number of
  // data-parallel ranks, so the validation loss does not depend on it either.
  const int64_t micro_batches = recipe.train.eval_iters * accum;
  double sum = 0;
  for (int64_t i = 0; i < micro_batches; ++i) {
    val_data->next(x.data(), y.data());
    autograd::Graph g(*ctx);
    autograd::NoGradGuard no_grad(g);
    Tensor loss = model->forward(g, ops::from_host<int32_t>(*ctx, x, Shape{B, T}),
                                 ops::from_host<int32_t>(*ctx, y, Shape{B, T}), B * T);
    sum += ops::item(*ctx, loss);
  }
  return sum_over_ranks({sum})[0] / double(micro_batches * dp_size);
}

void Trainer::State::prepare_sample() {
  if (!options.print_sample) return;
  // Decided the same way on every rank, before training, so that every rank generates or none.
  std::string why_not;
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

TrainResult Trainer::run() {
  return abort_world_on_error(s_->world, [&] { return run_steps(); });
}

TrainResult Trainer::run_steps() {
  State& s = *s_;
  TrainResult result;
  result.first_step = s.step;
  const bool terminal = stdout_is_terminal() && s.options.out == stdout;
  const int64_t total = s.recipe.train.train_iters;
  const int64_t tokens_per_step = s.recipe.train.global_batch_size * s.recipe.model.seq_length;
  double timed_seconds = 0, timed_optimizer = 0, timed_issue = 0, timed_queue = 0,
         timed_forward_backward = 0;
  MemoryStats allocs_before;
  int64_t timed_steps = 0;
  s.ctx->allocator()->reset_peak();

  while (s.step < total) {
    s.world->set_step(s.step + 1);
    const bool timed = s.step + 1 - result.first_step > s.options.warmup_steps;
    if (s.options.profile_timed_steps && timed && timed_steps == 0) profiler_capture(true);
    if (timed && timed_steps == 0) allocs_before = s.ctx->allocator()->stats();
    const auto t0 = Clock::now();
    const double lr = s.schedule.lr_at(s.step);
    double norm = 0;
    s.log_samples();
    const double local_loss = s.train_step(lr, &norm);
    // One small all-reduce carries the losses and any rank's stop request.
    const bool stop_here = s.options.stop_requested && s.options.stop_requested();
    const std::vector<double> summed = s.sum_over_ranks({local_loss, stop_here ? 1.0 : 0.0});
    const double loss = summed[0] / double(s.accum * s.dp_size);
    const double dt = seconds_since(t0);
    s.step++;
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
    if (timed) {
      timed_seconds += dt;
      timed_optimizer += s.last_optimizer_s();
      timed_issue += s.issue_host_s;
      timed_queue += s.queue_host_s;
      timed_forward_backward += s.last_forward_backward_s();
      const CollectiveTimes ct = s.sharded->take_collective_times();
      auto add = [](TrainResult::Collective& to, const CollectiveTime& c) {
        to.count += double(c.count);
        to.bytes += double(c.bytes);
        to.ms += c.ms;
      };
      add(result.all_gathers, ct.all_gather);
      add(result.reduce_scatters, ct.reduce_scatter);
      add(result.all_reduces, ct.all_reduce);
      timed_steps++;
    } else {
      (void)s.sharded->take_collective_times();  // warm-up steps are not counted
    }

    StepMetrics m;
    if (s.update_norms) m.update_norms = s.update_norms->after_step();
    m.step = s.step;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.step_time_s = dt;
    m.tokens_per_sec = double(tokens_per_step) / dt;
    m.mem_peak_bytes = int64_t(s.ctx->allocator()->stats().peak_in_use);
    if (s.ctx->is_cuda()) {
      const double per_gpu = m.tokens_per_sec / s.world->size();
      m.tflops = per_gpu * s.flops_per_token / 1e12;
      m.mfu = model_flops_utilization(per_gpu, s.flops_per_token, kH200PeakBf16Flops);
    }
    const bool eval_now = s.val_data && s.recipe.train.eval_interval > 0 &&
                          (s.step % s.recipe.train.eval_interval == 0 || s.step == total);
    if (eval_now) {
      m.val_loss = s.evaluate();
      result.val_losses.push_back(*m.val_loss);
    }
    const int64_t every = std::max<int64_t>(1, s.recipe.logger.log_interval);
    if (s.step % every == 0 || s.step == 1 || s.step == total || eval_now) {
      s.print(format_step_line(m, total, terminal));
      s.history.push_back(m);
      if (s.metrics) s.metrics->write(m);
    }
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
  if (s.options.profile_timed_steps && timed_steps > 0) profiler_capture(false);
  if (timed_steps > 0) {
    result.step_time_s = timed_seconds / double(timed_steps);
    result.optimizer_time_s = timed_optimizer / double(timed_steps);
    result.issue_time_s = timed_issue / double(timed_steps);
    result.queue_time_s = timed_queue / double(timed_steps);
    result.forward_backward_s = timed_forward_backward / double(timed_steps);
    const MemoryStats allocs_after = s.ctx->allocator()->stats();
    result.allocs_per_step = double(allocs_after.num_allocs - allocs_before.num_allocs) / double(timed_steps);
    result.system_allocs_per_step =
        double(allocs_after.num_system_allocs - allocs_before.num_system_allocs) / double(timed_steps);
    for (TrainResult::Collective* c :
         {&result.all_gathers, &result.reduce_scatters, &result.all_reduces}) {
      c->count /= double(timed_steps);
      c->bytes /= double(timed_steps);
      c->ms /= double(timed_steps);
    }
    result.tokens_per_sec = double(tokens_per_step) / result.step_time_s;
    if (s.ctx->is_cuda()) {
      const double per_device = result.tokens_per_sec / s.world->size();
      result.tflops_per_device = per_device * s.flops_per_token / 1e12;
      result.mfu = model_flops_utilization(per_device, s.flops_per_token, kH200PeakBf16Flops);
    }
  }
  const MemoryStats mem = s.ctx->allocator()->stats();
  result.peak_allocated_bytes = int64_t(mem.peak_in_use);
  result.peak_reserved_bytes = int64_t(mem.peak_reserved);
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
