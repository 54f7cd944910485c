// Trainer: one optimizer step and the training loop (the set-up is in trainer_start.cc,
// the run's accounting in run_stats.h).
#include "runtime/train/trainer_state.h"

namespace fsdp::train {

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
  for (auto& p : participants) p->start_step(*ctx);
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
  for (auto& p : participants) p->after_grad_sync(*ctx);
  const double norm = sharded->grad_norm();
  FSDP_CHECK(std::isfinite(norm), Error, "training diverged at step ", step + 1,
             ": the gradient norm is ", norm, " (lower optimizer.lr or check the data)");
  const double clip = clip_coefficient(norm, recipe.optimizer.clip_grad);
  clock->start_optimizer();
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

std::vector<double> Trainer::State::step_values(double local_loss, bool stop_here) {
  std::vector<double> values = {local_loss, stop_here ? 1.0 : 0.0};
  participant_values.clear();
  for (auto& p : participants) {
    const std::vector<double> v = p->local_values(*ctx);
    values.insert(values.end(), v.begin(), v.end());
    participant_values.push_back(v.size());
  }
  return values;
}

void Trainer::State::finish_participants(const std::vector<double>& summed, StepMetrics& m) {
  // Each participant's sums, where step_values put its values.
  size_t at = 2;
  const double forwards = double(accum * world->size());
  for (size_t i = 0; i < participants.size(); ++i) {
    const auto first = summed.begin() + long(at), last = first + long(participant_values[i]);
    participants[i]->after_optimizer_step(*ctx, std::vector<double>(first, last), forwards, m);
    at += participant_values[i];
  }
}

void Trainer::State::finish_run(TrainResult& result, RunStats& stats) {
  result.steps = step;
  result.cuda_graph_replays = graphs ? graphs->replays() : 0;
  for (const auto& p : participants) p->report(result);
  result.last_step_collectives = sharded->issued();
  stats.finish(result);
  if (world->rank() == 0 && !history.empty()) {
    const std::string chart = recipe.run.output_dir + "/loss.svg";
    write_loss_chart(chart, loss_series(history), recipe.run.name);
    print(str_cat("loss picture: ", chart));
  }
  if (sample_tokenizer && !result.stopped) {
    result.sample = sample_text();
    print(str_cat("sample: ", result.sample));
  }
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
    // One small all-reduce carries the losses, any rank's stop request and the
    // participants' values; every rank's micro-batch losses (the tensor-parallel ranks of
    // one data-parallel rank compute the same ones).
    const bool stop_here = s.options.stop_requested && s.options.stop_requested();
    const std::vector<double> summed = s.sum_over_ranks(s.step_values(*local_loss, stop_here));
    const double loss = summed[0] / double(s.accum * s.world->size());
    const double dt = seconds_since(t0);
    s.step++;
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
    stats.end_step(s.step, dt, s.clock->times(), s.sharded->take_collective_times());
    StepMetrics m = stats.metrics(s.step, loss, lr, norm, dt);
    s.finish_participants(summed, m);
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
  s.finish_run(result, stats);
  return result;
}

}  // namespace fsdp::train
