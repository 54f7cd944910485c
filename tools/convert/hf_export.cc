#include "tools/convert/hf_export.h"

#include <filesystem>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer_setup.h"
#include "tools/convert/hf_format.h"

namespace fsdp::convert {
namespace {

// Our logits for a fixed batch of token ids, from the checkpoint, on the CPU in f32.
void write_check_batch(const models::ModelConfig& config, const std::string& checkpoint_dir,
                       const std::string& path, const ExportOptions& options) {
  Context ctx;
  auto model = models::build_model(config);
  FsdpOptions fo;
  fo.strategy = ShardingStrategy::NoShard;
  fo.compute_dtype = DType::f32;
  fo.main_dtype = DType::f32;
  auto sharded = fully_shard(ctx, *model, DataParallelGroups(), fo);
  checkpoint::LoadOptions lo;
  lo.verify_checksums = false;  // export_hf has just verified them
  checkpoint::load_checkpoint(ctx, nullptr, *sharded, nullptr, checkpoint_dir, lo);

  const int64_t B = options.check_batch_size, T = std::min(options.check_seq_len, config.seq_len);
  const int64_t V = config.vocab_size;
  std::vector<int32_t> ids(size_t(B * T));
  uint64_t h = 0x2545f4914f6cdd1dull;
  for (int32_t& id : ids) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((h >> 33) % uint64_t(V));
  }
  autograd::Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  const Tensor logits = model->logits(g, ops::from_host<int32_t>(ctx, ids, Shape{B, T}));  // (B, T, Vp)
  Tensor ours = ctx.empty_host(Shape{B, T, V}, DType::f32);
  ops::copy(ctx, ours, ops::to_host(ctx, logits).slice(2, 0, V));
  Tensor ids64 = ctx.empty_host(Shape{B, T}, DType::i64);
  for (size_t i = 0; i < ids.size(); ++i) ids64.data<int64_t>()[i] = ids[i];
  checkpoint::save_safetensors(ctx, path, {{"input_ids", ids64}, {"logits", ours}}, {{"format", "pt"}});
}

}  // namespace

models::ModelConfig model_config_of_checkpoint(const checkpoint::CheckpointMetadata& m, const std::string& dir) {
  FSDP_CHECK(m.recipe_json != "null", CheckpointError, dir,
             ": the checkpoint holds no recipe, so the model it was trained as is unknown");
  try {
    return train::model_config_of(train::parse_recipe(m.recipe_json, {}, dir + "/metadata.json recipe"));
  } catch (const ConfigError& e) {
    FSDP_THROW(CheckpointError, dir, ": the recipe saved in the checkpoint does not load: ", e.what());
  }
}

models::ModelConfig export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                              const ExportOptions& options) {
  FSDP_CHECK(options.dtype == DType::f32 || options.dtype == DType::bf16, ValueError,
             "export: weights are stored as f32 or bf16, not ", dtype_name(options.dtype));
  const std::string dir = checkpoint::find_checkpoint(checkpoint_dir);
  FSDP_CHECK(!dir.empty(), CheckpointError, checkpoint_dir, ": no checkpoint there");
  checkpoint::CheckpointReader reader(dir);
  reader.verify_all_files();
  const models::ModelConfig config = model_config_of_checkpoint(reader.metadata(), dir);
  // The layout first: a model Hugging Face cannot express is refused before anything is written.
  const std::vector<HfTensor> tensors = hf_tensors(config);

  // Into a new or empty directory: an export never overwrites what is there.
  std::error_code ec;
  FSDP_CHECK(!std::filesystem::exists(out_dir, ec) ||
                 (std::filesystem::is_directory(out_dir, ec) && std::filesystem::is_empty(out_dir, ec)),
             ConfigError, "convert export: ", out_dir, " is not an empty directory; export into a "
             "new or empty one");
  std::filesystem::create_directories(out_dir);
  Context ctx;
  checkpoint::SafetensorsWriter writer(out_dir + "/model.safetensors", {{"format", "pt"}});
  for (const HfTensor& t : tensors) writer.declare(t.name, options.dtype, t.shape);
  // Tensors cut from one parameter (Llama's q/k/v, gate/up, Mixtral's experts) follow each
  // other: read it once.
  std::string loaded_name;
  Tensor loaded;
  for (const HfTensor& t : tensors) {
    if (t.ours != loaded_name) {
      loaded = reader.read_parameter(ctx, checkpoint::kMainWeights, t.ours);
      loaded_name = t.ours;
    }
    Tensor part = hf_rows(loaded).narrow(0, t.row_begin, t.rows);
    if (t.transpose) part = part.transpose(0, 1);
    FSDP_ASSERT(part.shape() == t.shape, t.name, ": cut ", part.shape(), " from ", t.ours, " for ", t.shape);
    Tensor out = ctx.empty_host(t.shape, options.dtype);
    ops::copy(ctx, out, part);
    writer.write(t.name, out.numel() ? out.data_ptr() : nullptr, out.nbytes());
  }
  writer.finish();
  checkpoint::write_file_atomically(out_dir + "/config.json",
                                    hf_config_json(config, options.dtype == DType::bf16 ? "bfloat16" : "float32"));
  if (options.check_batch)
    write_check_batch(config, dir, out_dir + "/fsdp_check_batch.safetensors", options);
  return config;
}

}  // namespace fsdp::convert
