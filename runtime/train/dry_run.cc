#include "runtime/train/dry_run.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "models/factory.h"
#include "runtime/parallel/expert_parallel.h"
#include "runtime/parallel/tensor_parallel.h"
#include "runtime/train/memory_prediction.h"
#include "runtime/train/metrics.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/trainer_setup.h"

namespace fsdp::train {
namespace {

// "what groups: [0 1] [2 3]" for the groups `axes` make, or nothing when each has one rank.
std::string groups_line(const char* what, const Mesh& mesh, const std::vector<MeshAxis>& axes) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < mesh.world_size(); ++r) {
    std::vector<int> g = mesh.group(axes, r);
    if (g.size() > 1 && std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  if (groups.empty()) return "";
  std::string out = str_cat("  ", what, " groups:");
  for (const std::vector<int>& g : groups) {
    out += " [";
    for (size_t i = 0; i < g.size(); ++i) out += str_cat(i ? " " : "", g[i]);
    out += "]";
  }
  return out + "\n";
}

// One line per kind of group that has more than one rank: "tensor-parallel groups: [0 1] [2 3]".
std::string mesh_groups(const Mesh& mesh) {
  const bool cp = mesh.size(MeshAxis::cp) > 1, ep = mesh.size(MeshAxis::ep) > 1;
  std::string out = groups_line("tensor-parallel", mesh, {MeshAxis::tp}) +
                    groups_line("context-parallel", mesh, {MeshAxis::cp}) +
                    groups_line("expert-parallel", mesh, {MeshAxis::ep}) +
                    groups_line("data-parallel (sharding)", mesh, {MeshAxis::dp_shard});
  // FSDP shards over the data-parallel ranks with the context- and expert-parallel ones;
  // the experts without the expert-parallel ones.
  if (cp || ep)
    out += groups_line(ep ? "FSDP sharding (data x context x expert-parallel)"
                          : "FSDP sharding (data x context-parallel)",
                       mesh, {MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::ep});
  if (cp && ep)
    out += groups_line("FSDP sharding of the experts (data x context-parallel)", mesh,
                       {MeshAxis::dp_shard, MeshAxis::cp});
  return out + groups_line("data-parallel (replicas)", mesh, {MeshAxis::dp_outer});
}

// The per-rank memory plan's lines: each part of the predicted peak, the peak with the
// first N blocks recomputed, and the page-locked host memory of CPU offload.
std::string memory_lines(const Recipe& recipe, const MemoryPrediction& p, const FsdpOptions& fo,
                         int ranks_per_device) {
  const MemoryBreakdown& mem = p.fsdp;
  const size_t opt = p.optimizer;
  const int64_t act = p.activations;
  std::string out;
  out += str_cat("memory per rank (", strategy_name(fo.strategy), "):\n",
                 "  compute weights   ", format_bytes(int64_t(mem.compute_weights)), "\n",
                 "  main weights      ", format_bytes(int64_t(mem.main_weights)), "\n",
                 "  grad accumulation ", format_bytes(int64_t(mem.grad_accumulation)), "\n",
                 "  full gradients    ", format_bytes(int64_t(mem.full_grads)), "\n",
                 "  gather buffers    ", format_bytes(int64_t(mem.gather_pool)), "\n",
                 "  gradient buffers  ", format_bytes(int64_t(mem.grad_pool)), "\n",
                 "  optimizer state   ", format_bytes(int64_t(opt)), "\n",
                 "  activations       ", format_bytes(act), " (estimate)\n",
                 p.fp8_weight_casts ? str_cat("  fp8 weight casts  ", format_bytes(p.fp8_weight_casts),
                                              " (both layouts, once per step)\n")
                                    : std::string(),
                 p.update_norms ? str_cat("  update norms      ", format_bytes(p.update_norms),
                                          " (logger.log_update_norms: the master shards' copy)\n")
                                : std::string(),
                 "  predicted peak    ", format_bytes(p.device_peak()), "\n",
                 ranks_per_device > 1
                     ? str_cat("  on one GPU        ", format_bytes(ranks_per_device * p.device_peak()),
                               " (", ranks_per_device, " ranks share it: dist.backend=staged)\n")
                     : std::string());
  // What full recompute of the first N blocks would make the peak (model.recompute_num_layers).
  const int64_t blocks = int64_t(p.activations_recomputing.size()) - 1;
  if (blocks > 0) {
    std::vector<int64_t> shown;  // about five values of N, the last one every block
    for (int64_t b = 0; b < blocks; b += std::max<int64_t>(1, blocks / 4)) shown.push_back(b);
    shown.push_back(blocks);
    out += "  peak recomputing the first N blocks:";
    for (const int64_t b : shown) {
      const int64_t peak = p.device_peak() - p.activations + p.activations_recomputing[size_t(b)];
      out += str_cat(b ? ", N=" : " N=", b, " ", format_bytes(peak));
    }
    out += "\n";
  }
  if (fo.offload_main) {
    // Beside the master weights and moments: the staging buffers the shard streams through.
    out += str_cat("host memory per rank (cpu offload, page-locked): main weights ",
                   format_bytes(int64_t(mem.host_main_weights)), ", optimizer state ",
                   format_bytes(int64_t(p.optimizer_state)), ", gradient and weight staging ",
                   format_bytes(p.offload_staging),
                   recipe.optimizer.overlap_cpu_offload ? " (with the overlapped update's gradient copy)" : "",
                   ", total ", format_bytes(p.host_offload()), "\n");
  }
  return out;
}

}  // namespace

std::string dry_run_report(Recipe recipe, int world_size, bool assume_cuda, int ranks_per_device) {
  recipe.resolve_device(assume_cuda);
  recipe.resolve_world(world_size);
  const MeshSizes sizes = mesh_sizes_of(recipe);
  const Mesh mesh(sizes, world_size);
  const models::ModelConfig mc = model_config_of(recipe);
  auto model = models::build_model(mc);  // specs only: no memory
  const int64_t n_params = model->num_parameters();  // the whole model's
  // The estimate is rank 0's: its slices under tensor parallelism (every rank's are equal).
  PlanningParallelGroup tp_plan(mesh.size(MeshAxis::tp), 0);
  PlanningParallelGroup cp_plan(mesh.size(MeshAxis::cp), 0);
  PlanningExpertParallelGroup ep_plan(mesh.size(MeshAxis::ep), 0);
  apply_model_parallel(*model, recipe, {&tp_plan, &cp_plan, &ep_plan});
  // FP8 layers keep other activations, and fp8_param gathers their weights in units of
  // their own.
  Fp8Report fp8;
  if (recipe.mixed_precision.fp8)
    fp8 = apply_fp8(*model, model->layer_table(), fp8_plan_of(recipe),
                    model->vocabulary_tables().head);
  const FsdpOptions fo = fsdp_options_of(recipe);
  check_offload_device(recipe);
  const MemoryPrediction p = predict_memory(recipe, *model, mesh);
  const ShardingPlan& plan = p.plan;
  const int64_t tokens = recipe.train.global_batch_size * recipe.model.seq_length;
  std::string out = recipe.summary();
  out += str_cat("\nmodel: ", mc.str(), "\nparameters: ", n_params, " (",
                 format_count(double(n_params)), ")\ntokens per step: ", tokens, " (",
                 recipe.train.global_batch_size, " sequences of ", recipe.model.seq_length,
                 "; ", recipe.grad_accum_steps(mesh.dp_size()), " micro-batches of ",
                 recipe.train.micro_batch_size, " per rank)\nmesh: ", mesh.str(), " on ",
                 world_size, " rank(s), ", recipe.dist.device, "\n", mesh_groups(mesh),
                 "training FLOPs per token: ",
                 format_count(flops_per_token(
                     n_params - int64_t(mc.inactive_parameters_per_token()), int(mc.n_layer),
                     int(mc.d_model), int(mc.seq_len))),
                 mc.is_moe() ? str_cat(" (active parameters: ",
                                       format_count(double(n_params) -
                                                    mc.inactive_parameters_per_token()),
                                       ")")
                             : std::string(),
                 "\n", recipe.mixed_precision.fp8 ? fp8_summary(recipe, fp8) + "\n" : "",
                 plan.describe());
  return out + memory_lines(recipe, p, fo, ranks_per_device);
}

}  // namespace fsdp::train
