#include "runtime/train/memory_prediction.h"

#include <sys/resource.h>

#include <algorithm>
#include <thread>

#include "runtime/optim/offload_step.h"
#include "runtime/parallel/data_parallel_groups.h"
#include "runtime/parallel/muon_matrices.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/trainer_setup.h"

namespace fsdp::train {

MemoryPrediction predict_memory(const Recipe& recipe, models::LanguageModel& model,
                                const Mesh& mesh) {
  const FsdpOptions fo = fsdp_options_of(recipe);
  PlanOptions po;
  const bool sharded = fo.strategy != ShardingStrategy::NoShard;
  // Experts shard over the data-parallel ranks that hold them; the rest over ep too.
  po.part_dp_size = sharded ? mesh.size(MeshAxis::dp_shard) * mesh.size(MeshAxis::cp) : 1;
  po.dp_size = po.part_dp_size * (sharded ? mesh.size(MeshAxis::ep) : 1);
  po.block = fo.shard_block;
  po.strategy = fo.strategy;
  MemoryPrediction p;
  p.plan = ShardingPlan::build(unit_specs(model, unit_module_kind(fo.unit_kind), fo.blocks_per_unit,
                                                fo.gather_codec.get(), kExpertPartName), po);
  p.fsdp = estimate_memory(p.plan, fo);
  const OptimizerKind kind = optimizer_kind_from_name(recipe.optimizer.optimizer);
  p.optimizer_state = optimizer_state_bytes(
      p.plan, kind, dtype_from_name(recipe.optimizer.moments_dtype), 0,
      kind == OptimizerKind::muon ? muon_param_names(model, model.layer_table()) : std::vector<std::string>{});
  // With CPU offload the moments (and the master weights) are in host memory.
  p.optimizer = fo.offload_main ? 0 : p.optimizer_state;
  const int64_t shard = int64_t(p.fsdp.host_main_weights / dtype_size(fo.main_dtype));
  if (fo.offload_main) {
    // The staging buffers the shard streams through: gradients down, compute weights up
    // (runtime/optim/offload_step.h).
    const OffloadOptions oo;
    const OffloadStaging st = offload_staging(shard, oo.chunk_numel, oo.slots);
    // Overlapped, the update reads a page-locked host copy of the gradient shards instead
    // of gradient slots.
    const bool overlap = recipe.optimizer.overlap_cpu_offload;
    p.offload_staging = int64_t(st.slots) * st.slot_numel * int64_t(dtype_size(fo.compute_dtype));
    p.offload_staging += overlap ? shard * int64_t(dtype_size(fo.reduce_dtype))
                                 : int64_t(st.slots) * st.slot_numel * int64_t(dtype_size(fo.reduce_dtype));
  }
  const models::ModelConfig mc = model_config_of(recipe);
  const int cp = recipe.model.context_parallel_size, tp = recipe.model.tensor_model_parallel_size;
  const std::vector<bool> fp8_blocks = fp8_block_mask(model);
  p.activations = activation_bytes_estimate(mc, recipe.train.micro_batch_size,
                                            recipe.model.seq_length / cp, fo.compute_dtype,
                                            recompute_of(recipe), tp,
                                            recipe.model.sequence_parallel, fp8_blocks,
                                            recipe.model.recompute_num_layers, cp);
  p.fp8_weight_casts = fp8_weight_cast_bytes(model);
  // train::UpdateNorms keeps a device copy of the master-weight shards (on the device: the
  // recipe refuses update norms with CPU offload).
  if (recipe.logger.log_update_norms) p.update_norms = int64_t(p.fsdp.main_weights);
  // Context parallelism: beside each rank's T / cp tokens (counted above), per layer the
  // whole sequence's keys and values it all-gathered (kept for backward).
  int64_t cp_keys_values = 0;
  if (cp > 1) {
    const int64_t kv_heads = std::max<int64_t>(1, (mc.n_kv_head ? mc.n_kv_head : mc.n_head) / tp);
    cp_keys_values = mc.n_layer * 2 * recipe.train.micro_batch_size * recipe.model.seq_length *
                     kv_heads * mc.head_dim() * int64_t(dtype_size(fo.compute_dtype));
  }
  p.activations += cp_keys_values;
  // The same with the first N blocks recomputed, for every N (the refusal names one).
  for (int64_t blocks = 0; blocks <= mc.n_layer; ++blocks)
    p.activations_recomputing.push_back(
        cp_keys_values + activation_bytes_estimate(mc, recipe.train.micro_batch_size,
                                                   recipe.model.seq_length / cp, fo.compute_dtype,
                                                   models::Recompute::full, tp,
                                                   recipe.model.sequence_parallel, fp8_blocks, blocks, cp));
  return p;
}

std::string MemoryPrediction::largest_part() const {
  const std::pair<const char*, int64_t> parts[] = {
      {"compute weights", int64_t(fsdp.compute_weights)},
      {"master weights", int64_t(fsdp.main_weights)},
      {"gradient accumulation", int64_t(fsdp.grad_accumulation)},
      {"full-size gradients", int64_t(fsdp.full_grads)},
      {"the gathered-weight pool", int64_t(fsdp.gather_pool)},
      {"the gradient pool", int64_t(fsdp.grad_pool)},
      {"the optimizer's device state", int64_t(optimizer)},
      {"activations", activations},
      {"FP8 weight casts", fp8_weight_casts},
      {"the update norms' copy of the master weights", update_norms},
  };
  const auto* largest = &parts[0];
  for (const auto& part : parts)
    if (part.second > largest->second) largest = &part;
  return str_cat(largest->first, " (", format_bytes(largest->second), ")");
}

int64_t runtime_address_space() {
  const int64_t threads = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  return (int64_t(2) << 30) + threads * (int64_t(128) << 20);
}

void check_address_space(int64_t need, const std::string& what) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  const int64_t have = int64_t(limit.rlim_cur);
  const int64_t kib = (need + 1023) / 1024;
  FSDP_CHECK(have >= need, ConfigError, "the address-space limit (ulimit -v) is ",
             format_bytes(have), ", but this process needs about ", format_bytes(need), " (",
             what, "): raise it to at least ", kib, " KiB (ulimit -v ", kib,
             ") or lift it (ulimit -v unlimited)");
}

void check_host_memory_fits(const MemoryPrediction& p, int host_ranks, int64_t host_capacity) {
  const int64_t each = p.host_offload(), ranks = std::max(host_ranks, 1);
  if (each == 0 || ranks * each <= host_capacity) return;
  const std::pair<const char*, int64_t> parts[] = {
      {"master weights", int64_t(p.fsdp.host_main_weights)},
      {"optimizer moments", int64_t(p.optimizer_state)},
      {"staging and gradient copies", p.offload_staging}};
  const auto* largest = &parts[0];
  for (const auto& part : parts)
    if (part.second > largest->second) largest = &part;
  std::string each_parts;
  for (const auto& part : parts)
    each_parts += str_cat(each_parts.empty() ? "" : ", ", part.first, " ", format_bytes(part.second));
  FSDP_THROW(ConfigError, "CPU offload needs about ", format_bytes(ranks * each),
             " of page-locked host memory (", ranks, " rank(s) on this host, ", format_bytes(each),
             " each: ", each_parts, ") but the host has ", format_bytes(host_capacity),
             "; the largest part is ", largest->first, " (", format_bytes(largest->second),
             "): keep the moments in bf16 (optimizer.moments_dtype=bf16), update in step "
             "(optimizer.overlap_cpu_offload=false holds no gradient copy), put fewer ranks on "
             "this host or shard over more hosts (each rank offloads only its shard), or turn "
             "optimizer.cpu_offload off; `train --dry-run` prints the prediction");
}

void check_memory_fits(const MemoryPrediction& p, Device device, int sharing_ranks,
                       int host_ranks) {
  const int64_t total = int64_t(device_memory_bytes(device));
  const int64_t sharers = std::max(sharing_ranks, 1);
  // A rank alone on its GPU has what is free now: the CUDA context, the communicators'
  // buffers and other processes' memory are already taken (the model is not yet allocated).
  // Ranks that share a GPU reach this point at different moments, some after others have
  // allocated: they are held to the whole memory.
  const bool alone_on_gpu = !device.is_cpu() && sharers == 1;
  const int64_t capacity = alone_on_gpu ? int64_t(device_memory_free_bytes(device)) : total;
  // The host also holds the offloaded master weights, moments and staging, for every rank.
  const int64_t host_extra = p.host_offload();
  if (!device.is_cpu())
    check_host_memory_fits(p, host_ranks, int64_t(device_memory_bytes(Device::cpu())));
  const int64_t need = sharers * (p.device_peak() + (device.is_cpu() ? host_extra : 0));
  if (need > capacity) {
    // The fewest blocks recomputed whole that would fit, when some number does.
    std::string fix;
    for (size_t blocks = 0; blocks < p.activations_recomputing.size() && fix.empty(); ++blocks) {
      const int64_t peak = p.device_peak() - p.activations + p.activations_recomputing[blocks];
      if (sharers * (peak + (device.is_cpu() ? host_extra : 0)) <= capacity &&
          p.activations_recomputing[blocks] < p.activations)
        fix = str_cat("set model.activation_recompute=full model.recompute_num_layers=", blocks,
                      " (predicted ", format_bytes(peak), " each)");
    }
    if (fix.empty())
      fix = "lower model.n_layer, model.d_model or train.micro_batch_size, shard more "
            "(ddp.data_parallel_sharding_strategy, more ranks), offload the optimizer "
            "(optimizer.cpu_offload), or recompute activations (model.activation_recompute)";
    FSDP_THROW(ConfigError, "this run needs about ", format_bytes(need),
               device.is_cpu() ? str_cat(" of host memory (", sharers, " rank(s) on this host, ",
                                         format_bytes(p.device_peak() + host_extra), " each)")
                               : sharers > 1 ? str_cat(" on the GPU (", sharers,
                                                       " ranks share it, ",
                                                       format_bytes(p.device_peak()), " each)")
                                             : std::string(" on the GPU"),
               " but ", device.str(), " has ", format_bytes(capacity),
               alone_on_gpu ? str_cat(" free (of ", format_bytes(total), ")") : std::string(),
               "; the largest part is ",
               p.largest_part(), ": ", fix, "; `train --dry-run` prints the prediction");
  }
  // This process's own address space: on the CPU its predicted memory and host buffers; on
  // a GPU its host buffers and CUDA's mapping of the device's memory.
  const int64_t mapped = device.is_cpu() ? p.device_peak() + host_extra : total + host_extra;
  check_address_space(mapped + runtime_address_space(),
                      str_cat("the predicted ", format_bytes(mapped), device.is_cpu() ? "" :
                              " (the GPU's memory mapped by CUDA and the host buffers)",
                              " and about ", format_bytes(runtime_address_space()),
                              " for the runtime's threads, OpenBLAS's buffers and MPI"));
}

}  // namespace fsdp::train
