#include "runtime/train/checkpointing.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/rank_agreement.h"
#include "runtime/checkpoint/save.h"
#include "kernels/ops.h"
#include "runtime/nn/moe.h"

namespace fsdp::train {
namespace {

// The model's state beside its parameters, the same on every rank: the MoE layers' expert
// biases, by the layer's name ("layers.1.mlp.expert_bias", moved from the global counts),
// and the FP8 layers' amax histories ("h.1.attn.qkv.fp8_amax_history", from amaxes taken
// over every rank). A bias not yet there (before the layer's first forward) is created as
// that forward would (zero), so that a load has somewhere to put the saved one.
std::vector<checkpoint::ModelBuffer> model_buffers(Context& ctx, nn::Module& model,
                                                   const Fp8DelayedScaling* fp8) {
  std::vector<checkpoint::ModelBuffer> out;
  if (fp8)
    for (auto& [name, history] : fp8->histories())
      out.push_back({name, history, /*optional=*/true, "mixed_precision.fp8_amax_history_len"});
  for (nn::Module* m : model.modules()) {
    auto* layer = dynamic_cast<nn::MoELayer*>(m);
    if (!layer || !layer->options().expert_bias) continue;
    Tensor& bias = layer->expert_bias();
    if (!bias.defined()) bias = ops::zeros(ctx, Shape{layer->options().experts}, DType::f32);
    out.push_back({layer->name() + ".expert_bias", bias, false, "model.num_moe_experts"});
  }
  return out;
}

}  // namespace

RunCheckpoints::RunCheckpoints(const Recipe& recipe, const CheckpointedParts& parts,
                               std::function<void(const std::string&)> print)
    : recipe_(recipe), parts_(parts), print_(std::move(print)) {}

void RunCheckpoints::check_save_directory() {
  if (!recipe_.checkpoint.save) return;
  const std::string& dir = *recipe_.checkpoint.save;
  // Every rank writes its own shards, maybe to a file system of its own node (the path may
  // differ between ranks): each one checks its directory.
  checkpoint::run_on_every_rank(*parts_.ctx, parts_.world, [&] {
    const int rank = parts_.world ? parts_.world->rank() : 0;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // several ranks at once: one creates it
    FSDP_CHECK(std::filesystem::is_directory(dir), ConfigError, "checkpoint.save = \"", dir,
               "\": rank ", rank, " cannot create the directory (",
               ec ? ec.message() : "a file is in the way", ")");
    const std::string probe = str_cat(dir, "/.write_test.", rank);
    errno = 0;
    FILE* f = std::fopen(probe.c_str(), "wb");
    const bool wrote = f != nullptr && std::fputc('x', f) != EOF;
    const bool closed = f != nullptr && std::fclose(f) == 0;
    const int why = errno;
    std::remove(probe.c_str());
    FSDP_CHECK(wrote && closed, ConfigError, "checkpoint.save = \"", dir, "\": rank ", rank,
               " cannot write files there (", std::strerror(why), ")");
  });
}

void RunCheckpoints::refuse_foreign_checkpoints() const {
  if (!recipe_.checkpoint.save || recipe_.checkpoint.overwrite) return;
  const std::string& save = *recipe_.checkpoint.save;
  checkpoint::run_on_every_rank(*parts_.ctx, parts_.world, [&] {
    if (parts_.world && parts_.world->rank() != 0) return;
    // Resumed from a checkpoint of the save directory itself: the run continues its own.
    std::error_code ec;
    if (!resumed_from_.empty() &&
        std::filesystem::equivalent(std::filesystem::path(resumed_from_).parent_path(), save, ec)) {
      return;
    }
    std::string theirs = checkpoint::find_checkpoint(save);
    if (theirs.empty()) theirs = checkpoint::newest_step_directory(save);
    FSDP_CHECK(theirs.empty(), ConfigError, "checkpoint.save = \"", save, "\" holds another ",
               "run's checkpoints (the newest: ", theirs, "), and this run ",
               resumed_from_.empty() ? std::string("starts fresh (--no-resume or checkpoint.load=null)")
                                     : str_cat("resumed from ", resumed_from_),
               ": its saves would replace and prune them. Resume from them "
               "(checkpoint.load=latest), save elsewhere, or set checkpoint.overwrite=true");
  });
}

std::string RunCheckpoints::resume_directory() const {
  const std::optional<std::string>& load = recipe_.checkpoint.load;
  if (!load) return "";
  if (*load == "latest") {
    // The save directory's newest checkpoint; none yet (a first run) means a fresh start.
    if (!recipe_.checkpoint.save) return "";
    const std::string& save = *recipe_.checkpoint.save;
    std::string dir = checkpoint::find_checkpoint(save);
    if (dir.empty()) {
      // Step directories without a `latest` marker (lost or deleted): resume from the
      // newest complete one rather than start over and prune them.
      dir = checkpoint::newest_step_directory(save);
      if (!dir.empty())
        print_(str_cat("checkpoint: ", save, " has no `latest` marker; resuming from its newest "
                       "complete checkpoint, ", dir));
    }
    return dir;
  }
  const std::string dir = checkpoint::find_checkpoint(*load);
  FSDP_CHECK(!dir.empty(), ConfigError, "checkpoint.load = \"", *load,
             "\": no checkpoint there (neither a metadata.json nor a `latest` marker); use "
             "checkpoint.load=null or --no-resume to start fresh");
  return dir;
}

std::optional<int64_t> RunCheckpoints::resume() {
  // Rank 0 decides where (the others may see the file system a moment later) and says so.
  std::string dir;
  checkpoint::run_on_every_rank(*parts_.ctx, parts_.world, [&] {
    if (parts_.world->rank() == 0) dir = resume_directory();
  });
  dir = checkpoint::all_gather_strings(*parts_.ctx, parts_.world, dir)[0];
  resumed_from_ = dir;
  if (dir.empty()) return std::nullopt;

  // The sample order is drawn from dataset.seed alone: resuming part-way through the data
  // with another seed would repeat some samples and never read others. (A checkpoint that
  // has read no data yet, as `convert import` writes, takes any seed.) Checked before
  // anything is loaded.
  checkpoint::run_on_every_rank(*parts_.ctx, parts_.world, [&] {
    const checkpoint::CheckpointReader saved(dir);
    const int64_t saved_seed = int64_t(saved.metadata().data_seed);
    const int64_t seed = recipe_.dataset.seed;
    FSDP_CHECK(saved.metadata().consumed_samples == 0 || saved_seed == seed, ConfigError,
               "dataset.seed = ", seed, " but checkpoint ", dir, " was saved by a run with "
               "dataset.seed = ", saved_seed, " after ", saved.metadata().consumed_samples,
               " samples: the data order is drawn from the seed, so resuming with another one "
               "would repeat some samples and skip others; resume with dataset.seed=",
               saved_seed, ", or start fresh (--no-resume or checkpoint.load=null)");
  });

  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::LoadOptions options;
  options.buffers = model_buffers(*parts_.ctx, parts_.model->model(), parts_.fp8);
  const checkpoint::CheckpointMetadata m = checkpoint::load_checkpoint(
      *parts_.ctx, parts_.world, *parts_.model, parts_.optimizer, dir, options);
  // The position is in samples: any world size and micro-batch size continue from it.
  parts_.train_data->seek(uint64_t(m.consumed_samples));
  if (parts_.fp8) parts_.fp8->after_load(*parts_.ctx);
  last_saved_step_ = m.step;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  print_(str_cat("resumed from ", dir, " at step ", m.step, " (saved by ", m.world_size, " ranks, ",
                 m.strategy, "; ", m.consumed_samples, " samples consumed; loaded in ", seconds, " s)"));
  return m.step;
}

void RunCheckpoints::after_step(int64_t step, bool final) {
  if (!recipe_.checkpoint.save || step == last_saved_step_) return;
  const int64_t every = recipe_.checkpoint.save_interval;
  if (!final && !(every > 0 && step % every == 0)) return;
  try {
    save(step);
  } catch (const Error& e) {
    // Every rank sees the same failure (the save agrees on it), so every rank goes on.
    if (final || !recipe_.checkpoint.continue_on_save_failure) throw;
    const std::string latest = checkpoint::read_latest_marker(*recipe_.checkpoint.save);
    print_(str_cat("warning: saving step ", step, " failed, training goes on "
                   "(checkpoint.continue_on_save_failure); latest is still ",
                   latest.empty() ? std::string("none") : latest, ": ", e.what()));
  }
}

void RunCheckpoints::save(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  // An optimizer update overlapped with the next forward must have written the master
  // weights and moments before they are read.
  if (parts_.optimizer) parts_.optimizer->finish_update();
  const data::DataLoader& data = *parts_.train_data;
  checkpoint::TrainingProgress p;
  p.step = step;
  p.consumed_samples = int64_t(data.position());
  p.consumed_tokens = p.consumed_samples * data.seq_len();
  p.init_seed = uint64_t(recipe_.run.seed);
  p.data_seed = uint64_t(recipe_.dataset.seed);
  p.mesh = parts_.mesh ? parts_.mesh->str() : "";
  p.recipe_json = recipe_.to_json_string();
  checkpoint::SaveOptions options;
  options.most_recent_k = recipe_.checkpoint.most_recent_k;
  options.buffers = model_buffers(*parts_.ctx, parts_.model->model(), parts_.fp8);
  const checkpoint::SaveResult r =
      checkpoint::save_checkpoint(*parts_.ctx, parts_.world, *parts_.model, parts_.optimizer,
                                  parts_.groups, p, *recipe_.checkpoint.save, options);
  last_saved_step_ = step;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  print_(str_cat("checkpoint saved: ", r.directory, " (", double(r.bytes) / (1024.0 * 1024.0),
                 " MiB in ", seconds, " s)"));
  if (!r.warning.empty()) print_("warning: " + r.warning);
}

}  // namespace fsdp::train
