// Starting a Trainer: its State is set up in order (the world and the mesh, the model with
// its parallel plans and sharding, the data, the output and checkpoints, the start-up
// report).
#include "runtime/train/trainer_state.h"

#include <cmath>

#include "kernels/ops.h"
#include "runtime/parallel/data_parallel_groups.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/matmul.h"
#endif

namespace fsdp::train {

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
  check_offload_device(recipe, options.offload_on_cpu);
  (void)optimizer_config_of(recipe);
  const int planned_dp = recipe.dist.dp_outer * recipe.dist.dp_shard;
  const CudaGraphPlan graph_plan =
      CudaGraphPlan::of(recipe, planned_dp, recipe.grad_accum_steps(planned_dp),
                        planned_dp > 1 && !options.skip_collectives);
  // Below what the runtime itself maps, MPI's start-up or OpenBLAS fails without a word.
  check_address_space(runtime_address_space(),
                      "the runtime's threads, OpenBLAS's buffers and MPI, before any model");
  WorldOptions wo;
  wo.backend = backend_from_name(recipe.dist.backend, "dist.backend");
  // Rounded up: any positive timeout the recipe allows is at least a millisecond.
  wo.timeout = std::chrono::milliseconds(
      int64_t(std::ceil(recipe.dist.distributed_timeout_minutes * 60000)));
  wo.print_summary = options.out != nullptr;
  wo.on_failure = options.on_comm_failure;
  wo.alone = options.alone;
  world = std::make_unique<World>(launch, wo);
  FSDP_ASSERT(world->size() == launch.size);
  mesh = std::make_unique<Mesh>(mesh_sizes_of(recipe), world->size());
  comms = std::make_unique<MeshCommunicators>(*world, *mesh);
  ctx = std::make_unique<Context>(world->device());
#if FSDP_WITH_CUDA
  if (ctx->is_cuda()) {
    kernels::cuda::MatmulTuning tuning;
    tuning.enabled = recipe.train.matmul_tuning;
    ctx->extension<kernels::cuda::Blas>().set_tuning(tuning);
  }
#endif
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

void Trainer::State::apply_fp8_plan() {
  const MixedPrecisionSection& mp = recipe.mixed_precision;
  if (ctx->is_cuda()) {
    std::string why;
    FSDP_CHECK(ops::fp8_available(*ctx, &why), ConfigError, "'mixed_precision.fp8' \"", *mp.fp8,
               "\": ", why);
    FSDP_CHECK(mp.compute_dtype == "bf16", ConfigError, "'mixed_precision.fp8' needs "
               "'mixed_precision.compute_dtype' \"bf16\", not \"", mp.compute_dtype, "\"");
  } else {
    FSDP_CHECK(options.simulate_fp8_on_cpu, ConfigError, "'mixed_precision.fp8' \"", *mp.fp8,
               "\" needs a GPU with FP8 tensor cores (compute capability 8.9 or newer); "
               "'dist.device' is \"cpu\"");
  }
  Fp8Plan plan = fp8_plan_of(recipe);
  plan.token_group = cp_group.get();
  const Fp8Report fp8 = apply_fp8(*model, model->layer_table(), plan,
                                   model->vocabulary_tables().head);
  if (mp.fp8_recipe == "delayed") {
    Fp8DelayedOptions delayed;
    delayed.history_len = mp.fp8_amax_history_len;
    delayed.use_max = mp.fp8_amax_compute_algo == "max";
    delayed.margin = mp.fp8_margin;
    fp8_delayed = std::make_unique<Fp8DelayedScaling>(*ctx, fp8.fp8_layers, fp8.fp8_weights, delayed);
  }
  participants.push_back(std::make_unique<Fp8Participant>(fp8, fp8_delayed.get(), &world->comm()));
  fp8_line = fp8_summary(recipe, fp8);
}

void Trainer::State::setup_model_and_sharding() {
  // The model as specs; fully_shard materializes and initializes only this rank's shards.
  model_config = model_config_of(recipe);
  model = models::build_model(model_config);
  n_params = model->num_parameters();  // the whole model's, before any split
  // Each rank's groups; a parallelism over one rank leaves the model as it is.
  if (mesh->size(MeshAxis::tp) > 1)
    tp_group = std::make_unique<CommunicatorParallelGroup>(comms->axis(MeshAxis::tp));
  if (mesh->size(MeshAxis::cp) > 1) {
    cp_group = std::make_unique<CommunicatorParallelGroup>(comms->axis(MeshAxis::cp));
    cp_layout = nn::ContextParallelLayout::make(recipe.model.seq_length, cp_group->size(),
                                                cp_group->rank());
  }
  if (mesh->size(MeshAxis::ep) > 1) {
    ep_group = std::make_unique<CommunicatorExpertParallelGroup>(
        comms->axis(MeshAxis::ep), recipe.model.moe_shared_expert_overlap);
  }
  apply_model_parallel(*model, recipe, {tp_group.get(), cp_group.get(), ep_group.get()});
  for (nn::MoELayer* layer : model->moe_layers())
    layer->set_shared_expert_overlap(recipe.model.moe_shared_expert_overlap);
  if (recipe.mixed_precision.fp8) apply_fp8_plan();
  models::set_activation_recompute(*model, recompute_of(recipe), recipe.model.recompute_num_layers);
  // A token runs through k of each MoE layer's E experts: the FLOPs count active parameters.
  flops_per_token = train::flops_per_token(
      n_params - int64_t(model_config.inactive_parameters_per_token()),
      int(model_config.n_layer), int(model_config.d_model), int(model_config.seq_len));
  auto moe = std::make_unique<MoeStep>(*model, recipe.model.moe_router_bias_update_rate,
                                       recipe.logger.log_expert_tokens);
  if (moe->active())
    participants.push_back(std::make_unique<MoeParticipant>(std::move(moe), ep_group ? comms.get() : nullptr));
  // A run whose predicted memory exceeds the device is refused before anything is allocated.
  memory_plan = predict_memory(recipe, *model, *mesh);
  check_memory_fits(memory_plan, ctx->device(),
                    ctx->is_cuda() ? world->ranks_on_device() : world->local_size(),
                    world->local_size());
  fsdp_options = fsdp_options_of(recipe);
  fsdp_options.skip_collectives = options.skip_collectives;
  fsdp_options.time_collectives = options.time_collectives;
  sharded = fully_shard(*ctx, *model, data_parallel_groups(*comms, fsdp_options.strategy), fsdp_options);
  // The parallelisms that split parameters add their gradient work and norms to FSDP's.
  if (tp_group) sharded->add_grad_sync_hook(std::make_unique<TensorParallelGradSync>(&comms->axis(MeshAxis::tp)));
  if (ep_group) sharded->add_grad_sync_hook(std::make_unique<ExpertParallelGradSync>(&comms->axis(MeshAxis::ep)));
  OptimizerConfig optimizer_config = optimizer_config_of(recipe);
  optimizer_config.offload_on_cpu = options.offload_on_cpu && recipe.optimizer.cpu_offload;
  // CPU offload: the ranks on this host share its cores.
  optimizer_config.offload.threads = host_threads_per_process(world->local_size());
  if (recipe.optimizer.overlap_cpu_offload) {
    // The host updates the ranges in the order the next forward gathers them, and each
    // unit's gather waits for its own ranges only.
    optimizer_config.offload.overlap = true;
    optimizer_config.offload.order = sharded->forward_range_order();
  }
  std::unique_ptr<MuonOrthogonalizer> muon;
  if (optimizer_config.kind == OptimizerKind::muon) {
    muon_matrices = std::make_unique<MuonMatrices>(*model, model->layer_table(),
                                                   tp_group ? &comms->axis(MeshAxis::tp) : nullptr,
                                                   recipe.optimizer.muon_split_qkv);
    muon = muon_orthogonalizer(*ctx, *sharded, muon_matrices->specs(), optimizer_config);
  }
  optimizer = std::make_unique<Optimizer>(*ctx, sharded->optimizer_ranges(), optimizer_config,
                                          std::move(muon));
  if (recipe.optimizer.overlap_cpu_offload) {
    Optimizer* opt = optimizer.get();
    // A unit's ranges are consecutive in the update order: the last one's event covers all.
    sharded->set_weights_fence([opt](size_t first, size_t last, bool block, Event* ready) {
      (void)first;
      return opt->range_ready(last - 1, block, ready);
    });
  }
  schedule = LrSchedule::from_recipe(recipe);
  if (recipe.logger.log_update_norms)
    participants.push_back(std::make_unique<UpdateNormsParticipant>(*ctx, *sharded));
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
                          sharded.get(), optimizer.get(), train_data.get(), fp8_delayed.get()};
  checkpoints = std::make_unique<RunCheckpoints>(recipe, parts, [this](const std::string& l) { print(l); });
  checkpoints->check_save_directory();
  std::optional<int64_t> resumed;
  if (options.resume) resumed = checkpoints->resume();
  checkpoints->refuse_foreign_checkpoints();
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
  if (!fp8_line.empty()) print(fp8_line);
  if (graphs)
    print(str_cat("cuda graphs: one micro-batch's forward+backward captured after an eager warm-up and "
                  "replayed for ", graphs->plan().graphs_last() ? "every later micro-batch"
                                                                : "the micro-batches before each step's last"));
  const size_t opt_bytes = optimizer->state_bytes();
  // The buffers the sharding and the optimizer allocated, then the plan's activations and
  // step-long copies, and the plan's peak: the figure the run was checked against and the dry
  // run prints.
  const int64_t act = memory_plan.activations, casts = memory_plan.fp8_weight_casts;
  const int64_t norms = memory_plan.update_norms;
  print(sharded->memory_report());
  print(str_cat("  optimizer state  ", format_bytes(int64_t(opt_bytes)),
                optimizer->offloaded()
                    ? str_cat(" (", format_bytes(int64_t(optimizer->host_state_bytes())),
                              " in pinned host memory: cpu offload, AdamW on ",
                              optimizer->offload()->threads(), " host threads, ",
                              format_bytes(int64_t(optimizer->offload()->staging_bytes())),
                              " of it staging)")
                    : std::string(),
                "\n  activations      ", format_bytes(act), " (estimate)",
                casts ? str_cat("\n  fp8 weight casts ", format_bytes(casts), " (both layouts, once per step)")
                      : std::string(),
                norms ? str_cat("\n  update norms     ", format_bytes(norms), " (the master shards' copy)")
                      : std::string(),
                "\n  predicted peak   ", format_bytes(memory_plan.device_peak())));
}

void Trainer::State::prepare_sample() {
  if (!options.print_sample) return;
  // Decided the same way on every rank, before training, so that every rank generates or none.
  std::string why_not;
  if (recipe.mixed_precision.fp8_param) {
    print("no text sample at the end of the run: generation's prompts are not a multiple of 16 "
          "tokens, which weights gathered in FP8 (mixed_precision.fp8_param) need");
    return;
  }
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

}  // namespace fsdp::train
