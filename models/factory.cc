#include "models/factory.h"

#include "models/gpt2.h"
#include "models/llama.h"

namespace fsdp::models {

std::unique_ptr<LanguageModel> build_model(const ModelConfig& config) {
  switch (config.family) {
    case Family::GPT2: return std::make_unique<GPT2>(config);
    case Family::Llama: return std::make_unique<Llama>(config);
  }
  FSDP_THROW(ConfigError, "unknown model family");
}

int64_t count_parameters(const ModelConfig& config) {
  return build_model(config)->num_parameters();
}

void set_activation_recompute(LanguageModel& model, const std::string& mode) {
  FSDP_CHECK(mode == "none" || mode == "full" || mode == "selective", ConfigError,
             "activation recompute '", mode, "' is not one of: none, full, selective");
  for (nn::Module* m : model.modules()) {
    m->set_recompute(false);
    if (auto* mlp = dynamic_cast<nn::MLP*>(m)) mlp->recompute_activation = false;
  }
  for (nn::Module* block : model.blocks()) {
    if (mode == "full") block->set_recompute(true);
    if (mode == "selective")
      for (nn::Module* m : block->modules_of_kind("mlp"))
        if (auto* mlp = dynamic_cast<nn::MLP*>(m)) mlp->recompute_activation = true;
  }
}

}  // namespace fsdp::models
