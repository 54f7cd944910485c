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

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::none: return "none";
    case Recompute::full: return "full";
    case Recompute::selective: return "selective";
  }
  return "?";
}

Recompute recompute_from_name(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "full") return Recompute::full;
  if (name == "selective") return Recompute::selective;
  FSDP_THROW(ConfigError, "activation recompute '", name, "' is not one of: none, full, selective");
}

void set_activation_recompute(LanguageModel& model, Recompute mode, int64_t full_blocks) {
  for (nn::Module* m : model.modules()) {
    m->set_recompute(false);
    if (auto* mlp = dynamic_cast<nn::MLP*>(m)) mlp->recompute_activation = false;
  }
  const std::vector<nn::Module*> blocks = model.blocks();
  FSDP_CHECK(full_blocks <= int64_t(blocks.size()), ConfigError, "activation recompute: ",
             full_blocks, " blocks to recompute, but the model has ", blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    nn::Module* block = blocks[i];
    if (mode == Recompute::full && (full_blocks < 0 || int64_t(i) < full_blocks))
      block->set_recompute(true);
    if (mode == Recompute::selective)
      for (nn::Module* m : block->modules())  // dense MLPs, MoE layers and shared experts
        if (auto* mlp = dynamic_cast<nn::MLP*>(m)) mlp->recompute_activation = true;
  }
}

}  // namespace fsdp::models
