#include "tools/generate/load_model.h"

#include <filesystem>
#include <map>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/metadata.h"
#include "runtime/core/error.h"
#include "runtime/nn/moe.h"
#include "tools/convert/hf_export.h"
#include "tools/convert/hf_import.h"

namespace fsdp::generate {
namespace {

// Gives every parameter of `model` its weights, read on the host by `read(name)` and
// converted to `dtype` on ctx's device.
template <typename ReadFn>
void install_weights(Context& ctx, models::LanguageModel& model, DType dtype, ReadFn read) {
  for (nn::Parameter* p : model.named_parameters()) {
    const Tensor host = read(p->name());
    FSDP_CHECK(host.shape() == p->shape(), CheckpointError, p->name(), ": stored as ",
               host.shape(), ", the model has ", p->shape());
    p->data = ctx.empty(p->shape(), dtype);
    ops::copy(ctx, p->data, host);
  }
}

// Gives every MoE layer that routes with an expert bias (aux-loss-free balancing) the bias it
// trained to: state beside the parameters, in the checkpoint's buffers. Without it the
// tokens would go to other experts than in training.
void install_expert_biases(Context& ctx, Context& host, models::LanguageModel& model,
                           checkpoint::CheckpointReader& reader, const std::string& dir) {
  for (nn::Module* m : model.modules()) {
    auto* layer = dynamic_cast<nn::MoELayer*>(m);
    if (!layer || !layer->options().expert_bias) continue;
    const std::string name = layer->name() + ".expert_bias";
    FSDP_CHECK(reader.metadata().find_buffer(name) != nullptr, CheckpointError, dir,
               ": no buffer \"", name, "\", which the model routes with "
               "(model.moe_router_enable_expert_bias)");
    const Tensor stored = reader.read_buffer(host, name);
    FSDP_CHECK(stored.shape() == Shape{layer->options().experts}, CheckpointError, dir, ": ",
               name, " is ", stored.shape(), ", the model has ", layer->options().experts,
               " experts");
    layer->expert_bias() = ctx.empty(stored.shape(), DType::f32);
    ops::copy(ctx, layer->expert_bias(), stored);
  }
}

}  // namespace

std::unique_ptr<models::LanguageModel> load_model(Context& ctx, const std::string& path,
                                                  DType dtype) {
  Context host;
  if (std::filesystem::exists(std::filesystem::path(path) / "config.json")) {
    convert::HfModel hf = convert::read_hf_model(host, path);
    auto model = models::build_model(hf.config);
    install_weights(ctx, *model, dtype, [&](const std::string& name) {
      const auto it = hf.params.find(name);
      FSDP_CHECK(it != hf.params.end(), CheckpointError, path, ": no weights for ", name);
      return it->second;
    });
    return model;
  }
  const std::string dir = checkpoint::find_checkpoint(path);
  FSDP_CHECK(!dir.empty(), CheckpointError, path,
             ": neither a Hugging Face directory (config.json) nor a checkpoint (metadata.json, "
             "or a save directory with a complete one)");
  checkpoint::CheckpointReader reader(dir);
  reader.verify_all_files();  // a damaged checkpoint is refused, as train and export refuse it
  auto model = models::build_model(convert::model_config_of_checkpoint(reader.metadata(), dir));
  install_weights(ctx, *model, dtype, [&](const std::string& name) {
    return reader.read_parameter(host, checkpoint::kMainWeights, name);
  });
  install_expert_biases(ctx, host, *model, reader, dir);
  return model;
}

}  // namespace fsdp::generate
