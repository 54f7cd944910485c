// The sharding plan: where every parameter element lives, as plain values.
//
// A model's parameters are grouped into units (by default one per transformer block, plus
// the root unit: embeddings, final norm, head). Each unit's parameters are laid out one after
// another in one flat buffer:
//
//   | decayed params (2-D weights, embeddings) | non-decayed params (biases, norms) | pad |
//   ^ each parameter starts at a multiple of kParamAlign elements
//
// padded to a multiple of dp_size * kBlock elements, so that data-parallel rank r owns the
// contiguous, equal-length shard [r * shard_numel, (r + 1) * shard_numel). Shard boundaries
// therefore fall on kBlock boundaries: per-block partial sums (the gradient norm) are the
// same whatever the data-parallel size, which keeps sharded runs bitwise equal to a single
// process on the CPU.
//
// Nothing here allocates or communicates: the plan is computed identically on every rank
// from the model's parameter specs (unit_specs, at the end) and checked across ranks
// through hash().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/shape.h"

namespace fsdp::nn {
class Module;
}

namespace fsdp {

class GatherCodec;

enum class ShardingStrategy : uint8_t {
  NoShard,           // DDP: everything replicated; all-reduce gradients
  Optim,             // ZeRO-1: main weights and optimizer state sharded
  OptimGrads,        // ZeRO-2: + gradients sharded (reduce-scatter every micro-batch)
  OptimGradsParams,  // ZeRO-3 / FSDP: + compute weights sharded (gathered per unit)
};
const char* strategy_name(ShardingStrategy s);
// Accepts "no_shard" | "optim" | "optim_grads" | "optim_grads_params" and "0".."3".
ShardingStrategy strategy_from_name(const std::string& name);

// Elements every parameter's offset in a flat buffer is aligned to (256 bytes of bf16:
// vectorized loads and cuBLAS both like it).
constexpr int64_t kParamAlign = 128;

// One parameter as the model declares it.
struct ParamSpec {
  std::string name;  // full dotted name, unique in the model
  Shape shape;
  bool weight_decay = false;
  // Its ranks' parts differ within the data-parallel group (nn::Placement::
  // parts_within_data_parallel): sharded over the part groups, in a part unit.
  bool part = false;
  // Gathered through a gather codec (gather_codec.h) at this many bytes per element: goes in
  // an encoded unit; 0: gathered as compute weights.
  int64_t wire_element_size = 0;
};

// Where one parameter sits in its unit's flat buffer.
struct ParamPlacement {
  std::string name;
  Shape shape;
  bool weight_decay = false;
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
};

// A contiguous piece of one parameter inside one rank's shard.
struct ShardSegment {
  int param = 0;              // index into UnitPlan::params
  int64_t param_offset = 0;   // first element of the parameter covered
  int64_t shard_offset = 0;   // where it sits in the shard
  int64_t numel = 0;
};

// A contiguous range of a rank's shard with one weight-decay setting (the optimizer runs
// one fused AdamW launch per range).
struct DecayRange {
  int64_t shard_offset = 0;
  int64_t numel = 0;
  bool weight_decay = false;
};

struct UnitPlan {
  std::string name;  // e.g. "root" or the block module's name, "h.3"; "h.3.<part name>"
  std::vector<ParamPlacement> params;
  // A part unit holds a block's parameters whose parts differ within the data-parallel
  // group (ParamSpec::part): it is sharded over the ranks holding the same part
  // (part_dp_size of them) and gathered and reduced with its block's unit, which precedes
  // it in the plan.
  bool part = false;
  // An encoded unit holds a block's weights that are all-gathered through a gather codec:
  // wire_element_size bytes per element on the wire and in the gathered buffer (0: not
  // encoded). It follows its block's unit as a part unit does (after it, if the block has
  // one).
  int64_t wire_element_size = 0;
  bool encoded() const { return wire_element_size > 0; }
  // Part and encoded units are companions: gathered and reduced with their block's unit.
  bool companion() const { return part || encoded(); }
  int dp_size = 1;           // the ranks the unit is sharded over
  int64_t numel = 0;         // used elements, alignment gaps included
  int64_t padded_numel = 0;  // a multiple of dp_size * block
  int64_t shard_numel = 0;   // padded_numel / dp_size

  int64_t shard_begin(int rank) const { return int64_t(rank) * shard_numel; }
  // The pieces of parameters that fall into `rank`'s shard, in buffer order.
  std::vector<ShardSegment> segments(int rank) const;
  // `rank`'s shard split into weight-decay / no-decay ranges (at most 3: decayed params,
  // non-decayed params, then padding, which is treated as decayed zeros and never moves).
  std::vector<DecayRange> decay_ranges(int rank) const;
  int param_index(const std::string& name) const;  // -1 when absent
};

struct PlanOptions {
  int dp_size = 1;
  int64_t block = 4096;  // shard granularity in elements (see the file comment)
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  int part_dp_size = 1;  // what part units are sharded over
};

class ShardingPlan {
 public:
  // `units[i]` lists the parameters of unit i in the model's order; each parameter must
  // appear in exactly one unit (a shared parameter, such as a tied embedding, once). A unit
  // whose parameters are all ParamSpec::part is a part unit, one whose
  // parameters all have a ParamSpec::wire_element_size an encoded unit; one that mixes
  // either kind with other parameters is refused.
  static ShardingPlan build(const std::vector<std::pair<std::string, std::vector<ParamSpec>>>& units,
                            const PlanOptions& options);

  const std::vector<UnitPlan>& units() const { return units_; }
  const PlanOptions& options() const { return options_; }
  int dp_size() const { return options_.dp_size; }
  ShardingStrategy strategy() const { return options_.strategy; }
  int64_t total_numel() const;         // parameters, without padding
  int64_t total_padded_numel() const;  // with padding
  // (unit, param) of a parameter by name; throws ValueError when absent.
  std::pair<int, int> find(const std::string& name) const;

  // A stable 64-bit hash of everything that must agree across ranks (unit names, parameter
  // names, shapes, offsets, sizes, strategy, dp size).
  uint64_t hash() const;
  // Human-readable table: one line per unit (params, numel, padded, shard) plus totals.
  std::string describe() const;

 private:
  std::vector<UnitPlan> units_;
  PlanOptions options_;
};

// ---- units of a model (what fully_shard groups, and the dry run's estimate with it)

// The modules of `module_kind` in forward order, grouped `per_unit` consecutive ones at a
// time (the last group may be shorter): each group is one unit, its collectives one bucket.
std::vector<std::vector<nn::Module*>> unit_module_groups(nn::Module& model,
                                                         const std::string& module_kind,
                                                         int per_unit = 1);
// A group's unit name: the module's name, or "first..last" for several.
std::string unit_group_name(const std::vector<nn::Module*>& group);

// The units of `model` as fully_shard() forms them: one per group of `per_unit` modules of
// `module_kind` in forward order (named by unit_group_name), each followed by a part unit
// ("<name>.<part_name>") when the group has parameters whose parts differ within the
// data-parallel group (DataParallelGroups::part_name names them), and with a gather
// `codec` by an encoded unit ("<name>.<codec name>") holding the group's parameters the codec
// takes, then "root" with every other parameter (a parameter shared by several modules
// appears once, in the root). The input of ShardingPlan::build.
std::vector<std::pair<std::string, std::vector<ParamSpec>>> unit_specs(nn::Module& model,
                                                                       const std::string& module_kind,
                                                                       int per_unit = 1,
                                                                       const GatherCodec* codec = nullptr,
                                                                       const std::string& part_name = "parts");

}  // namespace fsdp
