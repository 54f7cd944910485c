#include "tools/convert/hf_import.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/save.h"
#include "runtime/core/json_depth.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/train/recipe.h"
#include "tools/convert/hf_format.h"

namespace fsdp::convert {
namespace {

using Json = nlohmann::json;

// The safetensors files of a Hugging Face model directory: model.safetensors, or the files
// its index names.
std::vector<std::string> weight_files(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  if (checkpoint::file_size_or_missing(single) >= 0) return {single};
  const std::string index = dir + "/model.safetensors.index.json";
  FSDP_CHECK(checkpoint::file_size_or_missing(index) >= 0, CheckpointError, dir,
             ": neither model.safetensors nor model.safetensors.index.json");
  const std::string text = checkpoint::read_text_file(index);
  check_json_depth<CheckpointError>(text, index);
  std::set<std::string> names;
  try {
    const Json j = Json::parse(text);
    for (const auto& entry : j.at("weight_map").items()) names.insert(entry.value().get<std::string>());
  } catch (const Json::exception& e) {
    FSDP_THROW(CheckpointError, index, ": not a weight index (", e.what(), ")");
  }
  std::vector<std::string> files;
  for (const std::string& n : names) {
    FSDP_CHECK(n.find('/') == std::string::npos, CheckpointError, index, ": bad file name \"", n, "\"");
    files.push_back(dir + "/" + n);
  }
  return files;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

HfModel read_hf_model(Context& ctx, const std::string& hf_dir, int64_t padded_vocab_size) {
  HfModel out;
  const std::string config_path = hf_dir + "/config.json";
  FSDP_CHECK(checkpoint::file_size_or_missing(config_path) >= 0, CheckpointError, hf_dir, ": no config.json");
  out.config = model_config_from_hf(checkpoint::read_text_file(config_path), config_path, padded_vocab_size);
  const models::ModelConfig& c = out.config;

  // Which file holds each tensor; every tensor must be one we map or one we may ignore.
  std::vector<std::unique_ptr<checkpoint::SafetensorsReader>> readers;
  std::map<std::string, checkpoint::SafetensorsReader*> holder;
  for (const std::string& f : weight_files(hf_dir)) {
    readers.push_back(std::make_unique<checkpoint::SafetensorsReader>(f));
    for (const checkpoint::SafetensorsEntry& e : readers.back()->entries())
      holder[e.name] = readers.back().get();
  }
  const std::vector<HfTensor> tensors = hf_tensors(c);
  std::set<std::string> expected;
  for (const HfTensor& t : tensors) expected.insert(t.name);
  // GPT-2 checkpoints saved from GPT2Model (as OpenAI's) name tensors without "transformer.".
  auto stored_name = [&](const std::string& name) {
    if (holder.count(name) || c.family != models::Family::GPT2) return name;
    const std::string bare = name.substr(std::string("transformer.").size());
    return holder.count(bare) ? bare : name;
  };
  std::set<std::string> used;
  for (const HfTensor& t : tensors) used.insert(stored_name(t.name));
  for (const auto& [name, reader] : holder) {
    FSDP_CHECK(used.count(name) || is_ignorable_hf_tensor(name, c), CheckpointError, reader->path(),
               ": tensor \"", name, "\" is not part of a ", c.is_moe() ? "mixtral" : models::family_name(c.family),
               " model as config.json describes it");
  }

  // Every tensor's presence, shape and dtype against the files' headers, before anything is
  // allocated: sizes config.json claims but the files do not hold are refused by name.
  for (const HfTensor& t : tensors) {
    const std::string name = stored_name(t.name);
    auto it = holder.find(name);
    FSDP_CHECK(it != holder.end(), CheckpointError, hf_dir, ": tensor \"", t.name, "\" is missing");
    const checkpoint::SafetensorsEntry& e = it->second->entry(name);
    FSDP_CHECK(e.shape == t.shape, CheckpointError, it->second->path(), ": tensor \"", name, "\" is ",
               e.shape, ", expected ", t.shape, " from ", config_path);
    FSDP_CHECK(e.dtype == DType::f32 || e.dtype == DType::bf16 || e.dtype == DType::f16 || e.dtype == DType::f64,
               CheckpointError, it->second->path(), ": tensor \"", name, "\" is ",
               checkpoint::safetensors_dtype_name(e.dtype), ", not a floating type");
  }

  // Our parameters, assembled from their Hugging Face pieces.
  auto model = models::build_model(c);
  for (nn::Parameter* p : model->named_parameters())
    out.params[p->name()] = ops::zeros(ctx, p->shape(), DType::f32);
  for (const HfTensor& t : tensors) {
    const std::string name = stored_name(t.name);
    checkpoint::SafetensorsReader* file = holder.at(name);
    Tensor hf = file->load(ctx, name, /*on_host=*/true);
    // A NaN or infinite weight would train to NaN at once, far from its cause.
    FSDP_CHECK(std::isfinite(ops::item(ctx, ops::sum_squares(ctx, hf))), CheckpointError, hf_dir,
               ": tensor \"", name, "\" holds NaN or infinite values");
    Tensor dst = hf_rows(out.params.at(t.ours)).narrow(0, t.row_begin, t.rows);
    ops::copy(ctx, t.transpose ? dst.transpose(0, 1) : dst, hf);
  }
  return out;
}

std::string recipe_json_for(const models::ModelConfig& c) {
  std::vector<std::string> overrides = {
      std::string("model.family=") + models::family_name(c.family),
      "model.n_layer=" + std::to_string(c.n_layer),
      "model.n_head=" + std::to_string(c.n_head),
      "model.n_kv_head=" + std::to_string(c.n_kv_head),
      "model.d_model=" + std::to_string(c.d_model),
      "model.d_ff=" + std::to_string(c.d_ff),
      "model.vocab_size=" + std::to_string(c.vocab_size),
      "model.padded_vocab_size=" + std::to_string(c.padded_vocab_size),
      "model.seq_length=" + std::to_string(c.seq_len),
      std::string("model.tie_embeddings=") + (c.tie_embeddings ? "true" : "false"),
      "model.norm_eps=" + number_text(c.norm_eps),
      "model.rope_theta=" + number_text(c.rope_theta),
      "model.init_std=" + number_text(c.init_std),
  };
  if (c.is_moe()) {
    const std::vector<std::string> moe = {
        "model.num_moe_experts=" + std::to_string(c.num_moe_experts),
        "model.moe_router_topk=" + std::to_string(c.moe_router_topk),
        "model.moe_ffn_hidden_size=" + std::to_string(c.moe_ffn_hidden_size),
        "model.moe_shared_expert_intermediate_size=" + std::to_string(c.moe_shared_expert_intermediate_size),
        "model.moe_layer_freq=" + std::to_string(c.moe_layer_freq),
        "model.moe_first_k_dense_replace=" + std::to_string(c.moe_first_k_dense_replace),
        "model.moe_router_score_function=" + c.moe_router_score_function,
        std::string("model.moe_router_normalize=") + (c.moe_router_normalize ? "true" : "false"),
        std::string("model.moe_router_enable_expert_bias=") + (c.moe_router_enable_expert_bias ? "true" : "false"),
        "model.moe_router_load_balancing_type=" + c.moe_router_load_balancing_type,
        "model.moe_aux_loss_coeff=" + number_text(c.moe_aux_loss_coeff),
        "model.moe_z_loss_coeff=" + number_text(c.moe_z_loss_coeff),
    };
    overrides.insert(overrides.end(), moe.begin(), moe.end());
  }
  return train::parse_recipe("{}", overrides, "import").to_json_string();
}

std::string write_step0_checkpoint(Context& ctx, const HfModel& hf, const std::string& save_dir) {
  // A save directory that holds checkpoints already: a step-0 import would move its
  // `latest` back to step 0 and let later saves prune the run's steps.
  FSDP_CHECK(checkpoint::find_checkpoint(save_dir).empty() &&
                 checkpoint::newest_step_directory(save_dir).empty(),
             ConfigError, "convert import: ", save_dir, " holds checkpoints already; import into a "
             "new or empty directory");
  auto model = models::build_model(hf.config);
  FsdpOptions fo;
  fo.strategy = ShardingStrategy::NoShard;
  fo.compute_dtype = DType::f32;
  fo.main_dtype = DType::f32;
  auto sharded = fully_shard(ctx, *model, DataParallelGroups(), fo);
  for (int u = 0; u < sharded->num_units(); ++u) {
    const Tensor main = sharded->main_shard(u);
    for (const ParamPlacement& p : sharded->plan().units()[size_t(u)].params)
      ops::copy(ctx, main.narrow(0, p.offset, p.numel), hf.params.at(p.name).flatten());
  }
  checkpoint::TrainingProgress progress;
  progress.recipe_json = recipe_json_for(hf.config);
  return checkpoint::save_checkpoint(ctx, nullptr, *sharded, nullptr, DataParallelGroups(), progress, save_dir)
      .directory;
}

}  // namespace fsdp::convert
