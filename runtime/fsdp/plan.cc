#include "runtime/fsdp/plan.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "runtime/core/error.h"
#include "runtime/fsdp/gather_codec.h"
#include "runtime/nn/module.h"

namespace fsdp {

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::NoShard: return "no_shard";
    case ShardingStrategy::Optim: return "optim";
    case ShardingStrategy::OptimGrads: return "optim_grads";
    case ShardingStrategy::OptimGradsParams: return "optim_grads_params";
  }
  return "?";
}

ShardingStrategy strategy_from_name(const std::string& name) {
  if (name == "no_shard" || name == "0") return ShardingStrategy::NoShard;
  if (name == "optim" || name == "1") return ShardingStrategy::Optim;
  if (name == "optim_grads" || name == "2") return ShardingStrategy::OptimGrads;
  if (name == "optim_grads_params" || name == "3") return ShardingStrategy::OptimGradsParams;
  FSDP_THROW(ConfigError, "unknown sharding strategy '", name,
             "' (expected no_shard, optim, optim_grads, optim_grads_params, or 0-3)");
}

namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

std::vector<ShardSegment> UnitPlan::segments(int rank) const {
  const int64_t lo = shard_begin(rank), hi = lo + shard_numel;
  std::vector<ShardSegment> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamPlacement& p = params[i];
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b >= e) continue;
    out.push_back({int(i), b - p.offset, b - lo, e - b});
  }
  return out;
}

std::vector<DecayRange> UnitPlan::decay_ranges(int rank) const {
  // Decayed parameters come first in the buffer, so the shard splits at the first
  // non-decayed parameter's offset and again where the padding begins.
  int64_t split = numel, end = numel;
  for (const ParamPlacement& p : params) {
    if (!p.weight_decay) {
      split = p.offset;
      break;
    }
  }
  const int64_t lo = shard_begin(rank), hi = lo + shard_numel;
  std::vector<DecayRange> out;
  auto add = [&](int64_t b, int64_t e, bool decay) {
    b = std::max(b, lo);
    e = std::min(e, hi);
    if (b < e) out.push_back({b - lo, e - b, decay});
  };
  add(0, split, true);
  add(split, end, false);
  add(end, padded_numel, true);  // padding: zeros with zero gradients stay zero
  return out;
}

int UnitPlan::param_index(const std::string& pname) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == pname) return int(i);
  return -1;
}

ShardingPlan ShardingPlan::build(
    const std::vector<std::pair<std::string, std::vector<ParamSpec>>>& units,
    const PlanOptions& options) {
  FSDP_CHECK(options.dp_size >= 1 && options.part_dp_size >= 1, ConfigError,
             "data-parallel sizes must be >= 1, got ", options.dp_size, " and (part units) ",
             options.part_dp_size);
  FSDP_CHECK(options.block >= kParamAlign && options.block % kParamAlign == 0, ConfigError,
             "shard block must be a positive multiple of ", kParamAlign, ", got ", options.block);
  ShardingPlan plan;
  plan.options_ = options;
  std::set<std::string> unit_names, param_names;
  for (const auto& [uname, specs] : units) {
    FSDP_CHECK(unit_names.insert(uname).second, ValueError, "unit '", uname, "' appears twice");
    UnitPlan u;
    u.name = uname;
    const auto parts = std::count_if(specs.begin(), specs.end(), [](const ParamSpec& s) { return s.part; });
    FSDP_CHECK(parts == 0 || parts == int64_t(specs.size()), ValueError, "unit '", uname,
               "' mixes parameters whose parts differ within the data-parallel group with "
               "others; they go in a unit of their own");
    u.part = parts > 0;
    const int64_t wire = specs.empty() ? 0 : specs.front().wire_element_size;
    const bool alike = std::all_of(specs.begin(), specs.end(),
                                   [&](const ParamSpec& s) { return s.wire_element_size == wire; });
    FSDP_CHECK(wire >= 0 && alike && (wire == 0 || !u.part), ValueError, "unit '", uname,
               "' mixes weights gathered through a codec with others; they go in a unit of their own");
    u.wire_element_size = wire;
    u.dp_size = u.part ? options.part_dp_size : options.dp_size;
    // Decayed parameters first (stable: model order within each group).
    std::vector<const ParamSpec*> ordered;
    for (const ParamSpec& s : specs)
      if (s.weight_decay) ordered.push_back(&s);
    for (const ParamSpec& s : specs)
      if (!s.weight_decay) ordered.push_back(&s);
    int64_t offset = 0;
    for (const ParamSpec* s : ordered) {
      FSDP_CHECK(param_names.insert(s->name).second, ValueError, "parameter '", s->name,
                 "' appears in more than one unit (a shared parameter belongs to one unit)");
      offset = round_up(offset, kParamAlign);
      const int64_t n = s->shape.numel();
      u.params.push_back({s->name, s->shape, s->weight_decay, offset, n});
      offset += n;
    }
    u.numel = offset;
    u.padded_numel = round_up(std::max<int64_t>(offset, 1), int64_t(u.dp_size) * options.block);
    u.shard_numel = u.padded_numel / u.dp_size;
    plan.units_.push_back(std::move(u));
  }
  return plan;
}

int64_t ShardingPlan::total_numel() const {
  int64_t n = 0;
  for (const UnitPlan& u : units_)
    for (const ParamPlacement& p : u.params) n += p.numel;
  return n;
}

int64_t ShardingPlan::total_padded_numel() const {
  int64_t n = 0;
  for (const UnitPlan& u : units_) n += u.padded_numel;
  return n;
}

std::pair<int, int> ShardingPlan::find(const std::string& name) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    const int p = units_[u].param_index(name);
    if (p >= 0) return {int(u), p};
  }
  FSDP_THROW(ValueError, "parameter '", name, "' is not in the sharding plan");
}

namespace {

// FNV-1a over bytes, for the cross-rank plan check (not for security).
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= c[i];
      h *= 1099511628211ull;
    }
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    i64(int64_t(s.size()));
    bytes(s.data(), s.size());
  }
};

}  // namespace

uint64_t ShardingPlan::hash() const {
  Fnv f;
  f.i64(options_.dp_size);
  f.i64(options_.part_dp_size);
  f.i64(options_.block);
  f.i64(int64_t(options_.strategy));
  for (const UnitPlan& u : units_) {
    f.str(u.name);
    f.i64(u.part);
    f.i64(u.wire_element_size);
    f.i64(u.padded_numel);
    for (const ParamPlacement& p : u.params) {
      f.str(p.name);
      f.i64(p.offset);
      f.i64(p.weight_decay);
      for (int64_t d : p.shape.dims()) f.i64(d);
    }
  }
  return f.h;
}

std::string ShardingPlan::describe() const {
  const std::string part_dp = options_.part_dp_size == options_.dp_size
                                  ? ""
                                  : str_cat(" (part units: ", options_.part_dp_size, ")");
  std::string out = str_cat("sharding plan: ", strategy_name(options_.strategy), ", dp ",
                            options_.dp_size, part_dp, ", ", units_.size(), " units\n");
  char line[256];
  std::snprintf(line, sizeof line, "  %-16s %7s %14s %14s %14s\n", "unit", "params", "elements",
                "padded", "shard");
  out += line;
  for (const UnitPlan& u : units_) {
    std::snprintf(line, sizeof line, "  %-16s %7zu %14lld %14lld %14lld\n", u.name.c_str(),
                  u.params.size(), (long long)u.numel, (long long)u.padded_numel,
                  (long long)u.shard_numel);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-16s %7s %14lld %14lld\n", "total", "",
                (long long)total_numel(), (long long)total_padded_numel());
  out += line;
  return out;
}

// ---------------------------------------------------------------- units of a model

std::vector<std::vector<nn::Module*>> unit_module_groups(nn::Module& model,
                                                         const std::string& module_kind,
                                                         int per_unit) {
  FSDP_CHECK(per_unit >= 1, ConfigError, "blocks per FSDP unit must be at least 1, got ", per_unit);
  std::vector<std::vector<nn::Module*>> groups;
  for (nn::Module* m : model.modules_of_kind(module_kind)) {
    FSDP_CHECK(m != &model, ConfigError, "the root module cannot be a unit of kind '", module_kind, "'");
    if (groups.empty() || int(groups.back().size()) == per_unit) groups.emplace_back();
    groups.back().push_back(m);
  }
  return groups;
}

std::string unit_group_name(const std::vector<nn::Module*>& group) {
  if (group.size() == 1) return group.front()->name();
  return group.front()->name() + ".." + group.back()->name();
}

std::vector<std::pair<std::string, std::vector<ParamSpec>>> unit_specs(nn::Module& model,
                                                                       const std::string& module_kind,
                                                                       int per_unit,
                                                                       const GatherCodec* codec,
                                                                       const std::string& part_name) {
  std::vector<std::pair<std::string, std::vector<ParamSpec>>> specs;
  std::set<nn::Parameter*> in_blocks;
  auto spec = [](const nn::Parameter* p) {
    return ParamSpec{p->name(), p->shape(), p->weight_decay(),
                     p->placement().parts_within_data_parallel(), 0};
  };
  for (const std::vector<nn::Module*>& group : unit_module_groups(model, module_kind, per_unit)) {
    std::vector<ParamSpec> ps, parts, encoded;
    for (nn::Module* m : group)
      for (nn::Parameter* p : m->named_parameters()) {
        FSDP_CHECK(in_blocks.insert(p).second, ConfigError, "parameter '", p->name(),
                   "' is shared between two units; shared parameters must live in the root unit");
        const bool part = p->placement().parts_within_data_parallel();
        if (codec && !part && codec->takes(*p)) {
          encoded.push_back(spec(p));
          encoded.back().wire_element_size = codec->wire_element_size();
        } else {
          (part ? parts : ps).push_back(spec(p));
        }
      }
    const std::string name = unit_group_name(group);
    specs.emplace_back(name, std::move(ps));
    if (!parts.empty()) specs.emplace_back(name + "." + part_name, std::move(parts));
    if (!encoded.empty()) specs.emplace_back(name + "." + codec->name(), std::move(encoded));
  }
  std::vector<ParamSpec> root;
  for (nn::Parameter* p : model.named_parameters()) {
    if (in_blocks.count(p)) continue;
    FSDP_CHECK(!p->placement().parts_within_data_parallel(), ConfigError, "parameter '", p->name(),
               "' (its parts differ within the data-parallel group) is outside every unit of "
               "kind '", module_kind, "': it must be part of a block");
    root.push_back(spec(p));
  }
  specs.emplace_back("root", std::move(root));
  return specs;
}

}  // namespace fsdp
