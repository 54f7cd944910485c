#include "runtime/train/update_norms.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "kernels/ops.h"

namespace fsdp::train {

std::string tensor_group(const std::string& param_name) {
  std::string group;
  size_t start = 0;
  while (start <= param_name.size()) {
    size_t end = param_name.find('.', start);
    if (end == std::string::npos) end = param_name.size();
    const std::string part = param_name.substr(start, end - start);
    const bool number = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (!group.empty()) group += '.';
    group += number ? "*" : part;
    start = end + 1;
  }
  return group;
}

UpdateNorms::UpdateNorms(Context& ctx, ShardedModel& model) : ctx_(ctx), model_(model) {
  for (int u = 0; u < model_.num_units(); ++u) {
    const Tensor shard = model_.main_shard(u);
    FSDP_CHECK(shard.device() == ctx_.device(), ConfigError,
               "logger.log_update_norms needs the master weights on the compute device");
    before_.push_back(ctx_.empty(shard.shape(), shard.dtype()));
  }
  for (const UnitPlan& unit : model_.plan().units())
    for (const ParamPlacement& p : unit.params) groups_.push_back(tensor_group(p.name));
}

void UpdateNorms::before_step() {
  for (int u = 0; u < model_.num_units(); ++u) ops::copy(ctx_, before_[size_t(u)], model_.main_shard(u));
}

std::map<std::string, double> UpdateNorms::after_step() {
  for (int u = 0; u < model_.num_units(); ++u)
    ops::sub(ctx_, before_[size_t(u)], model_.main_shard(u), before_[size_t(u)]);  // the update
  const std::vector<double> sums = model_.param_sums_of_squares(before_);
  std::map<std::string, double> squares;
  for (size_t i = 0; i < sums.size(); ++i) squares[groups_[i]] += sums[i];
  std::map<std::string, double> norms;
  for (const auto& [group, sum] : squares) norms[group] = std::sqrt(sum);
  return norms;
}

}  // namespace fsdp::train
