#include "tools/convert/initial_weights.h"

#include <utility>
#include <vector>

#include "models/factory.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/nn/init.h"
#include "runtime/train/trainer_setup.h"

namespace fsdp::convert {

models::ModelConfig write_initial_weights(const train::Recipe& recipe, const std::string& path) {
  const models::ModelConfig config = train::model_config_of(recipe);
  const DType dtype = dtype_from_name(recipe.mixed_precision.main_params_dtype);
  const uint64_t seed = uint64_t(recipe.run.seed);
  Context ctx;  // the CPU: the initializer gives the same values on any device
  auto model = models::build_model(config);
  std::vector<std::pair<std::string, Tensor>> weights;
  for (nn::Parameter* p : model->named_parameters()) {
    Tensor w = ctx.empty(p->shape(), dtype);
    nn::init_parameter_range(ctx, *p, seed, 0, w.flatten());
    weights.emplace_back(p->name(), w);
  }
  std::map<std::string, std::string> meta = models::config_metadata(config);
  meta["seed"] = std::to_string(seed);
  meta["dtype"] = dtype_name(dtype);
  checkpoint::save_safetensors(ctx, path, weights, meta);
  return config;
}

}  // namespace fsdp::convert
