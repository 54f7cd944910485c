#include "tools/generate/load_model.h"

#include <filesystem>
#include <map>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/metadata.h"
#include "runtime/core/error.h"
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
  reader.check_files_present();
  auto model = models::build_model(convert::model_config_of_checkpoint(reader.metadata(), dir));
  install_weights(ctx, *model, dtype, [&](const std::string& name) {
    return reader.read_parameter(host, checkpoint::kMainWeights, name);
  });
  return model;
}

}  // namespace fsdp::generate
