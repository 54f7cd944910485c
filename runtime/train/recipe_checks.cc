#include "runtime/train/recipe_checks.h"

#include <algorithm>
#include <utility>

#include "runtime/core/error.h"

namespace fsdp::train {
namespace {

void check_model(const ModelSection& m) {
  FSDP_CHECK(m.d_model % m.n_head == 0, ConfigError, "'model.d_model' (", m.d_model,
             ") must be divisible by 'model.n_head' (", m.n_head, ")");
  FSDP_CHECK(m.n_kv_head <= m.n_head && m.n_head % m.n_kv_head == 0, ConfigError,
             "'model.n_head' (", m.n_head, ") must be a multiple of 'model.n_kv_head' (",
             m.n_kv_head, ")");
  FSDP_CHECK(m.family != "gpt2" || m.n_kv_head == m.n_head, ConfigError,
             "'model.n_kv_head' (", m.n_kv_head, ") must equal 'model.n_head' (", m.n_head,
             ") for family \"gpt2\", which has no grouped-query attention");
  FSDP_CHECK(m.family != "llama" || (m.d_model / m.n_head) % 2 == 0, ConfigError,
             "llama's rotary embedding needs an even head size, but 'model.d_model' / "
             "'model.n_head' = ", m.d_model / m.n_head);
  FSDP_CHECK(m.padded_vocab_size >= m.vocab_size, ConfigError, "'model.padded_vocab_size' (",
             m.padded_vocab_size, ") must be at least 'model.vocab_size' (", m.vocab_size, ")");
  FSDP_CHECK(m.recompute_num_layers < 0 || m.activation_recompute == "full", ConfigError,
             "'model.recompute_num_layers' (", m.recompute_num_layers, ") picks the blocks "
             "that 'model.activation_recompute' \"full\" recomputes, but it is \"",
             m.activation_recompute, "\"");
  FSDP_CHECK(m.recompute_num_layers <= m.n_layer, ConfigError, "'model.recompute_num_layers' (",
             m.recompute_num_layers, ") is more than the model's 'model.n_layer' (", m.n_layer,
             ") blocks");
}

// Tensor and context parallelism: what can be told from the recipe alone.
void check_model_parallel(const Recipe& r) {
  const ModelSection& m = r.model;
  const int tp = m.tensor_model_parallel_size;
  // Each tensor-parallel rank computes whole heads and an equal share of the MLP.
  for (const auto& [key, n] : {std::pair<const char*, int>{"model.n_head", m.n_head},
                               {"model.d_ff", m.d_ff}})
    FSDP_CHECK(n % tp == 0, ConfigError, "'", key, "' (", n, ") is not divisible by "
               "'model.tensor_model_parallel_size' (", tp, ")");
  // Key/value heads are split over the ranks, or, when there are fewer of them, each is
  // replicated on tp / n_kv_head ranks.
  FSDP_CHECK(m.n_kv_head % tp == 0 || tp % m.n_kv_head == 0, ConfigError, "'model.n_kv_head' (",
             m.n_kv_head, ") neither divides nor is divisible by "
             "'model.tensor_model_parallel_size' (", tp, "): the key/value heads can be neither "
             "split over the tensor-parallel ranks nor replicated on them");
  // The embedding and the head split the vocabulary's rows into tp equal parts.
  FSDP_CHECK(m.padded_vocab_size % tp == 0, ConfigError, "'model.padded_vocab_size' (",
             m.padded_vocab_size, ") is not divisible by 'model.tensor_model_parallel_size' (",
             tp, "): the embedding and the head are split along the vocabulary; pad it to a "
             "multiple of ", tp);
  // Sequence parallelism splits every sequence into tp equal parts (with tp = 1 it is a no-op).
  FSDP_CHECK(!m.sequence_parallel || m.seq_length % tp == 0, ConfigError, "'model.seq_length' (",
             m.seq_length, ") is not divisible by 'model.tensor_model_parallel_size' (", tp,
             "), as 'model.sequence_parallel' needs");
  // Context parallelism cuts every sequence into 2 cp equal chunks (without it, none).
  const int cp = m.context_parallel_size;
  FSDP_CHECK(cp == 1 || m.seq_length % (2 * cp) == 0, ConfigError, "'model.seq_length' (", m.seq_length,
             ") is not divisible by 2 x 'model.context_parallel_size' (", 2 * cp, "): each "
             "context-parallel rank holds two of 2 x ", cp, " equal chunks of every sequence");
  for (const auto& [key, n] : {std::pair<const char*, int>{"model.tensor_model_parallel_size", tp},
                               {"model.context_parallel_size", cp}}) {
    if (n == 1) continue;
    FSDP_CHECK(!r.train.cuda_graphs, ConfigError, "'train.cuda_graphs' with '", key, "' ", n,
               " is not supported yet (the model-parallel collectives run inside the captured "
               "forward and backward)");
  }
}

// Mixture of experts: what this build supports.
void check_moe(const Recipe& r) {
  const ModelSection& m = r.model;
  const int ep = m.expert_model_parallel_size;
  FSDP_CHECK(ep == 1 || m.num_moe_experts > 0, ConfigError, "'model.expert_model_parallel_size' ",
             ep, " needs a mixture-of-experts model ('model.num_moe_experts' > 0)");
  FSDP_CHECK(!m.moe_shared_expert_overlap ||
                 (m.num_moe_experts > 0 && m.moe_shared_expert_intermediate_size > 0),
             ConfigError, "'model.moe_shared_expert_overlap' true needs MoE layers with a shared "
             "expert ('model.num_moe_experts' > 0 and 'model.moe_shared_expert_intermediate_size' "
             "> 0): it overlaps that expert with the routed tokens' exchange");
  if (m.num_moe_experts == 0) return;
  FSDP_CHECK(m.num_moe_experts % ep == 0, ConfigError, "'model.num_moe_experts' (", m.num_moe_experts,
             ") must be a multiple of 'model.expert_model_parallel_size' (", ep,
             "): each expert-parallel rank holds an equal part of the experts");
  if (ep > 1) {
    FSDP_CHECK(m.moe_token_dispatcher_type == "alltoall", ConfigError,
               "'model.moe_token_dispatcher_type' '", m.moe_token_dispatcher_type, "' with ",
               "'model.expert_model_parallel_size' ", ep, ": expert parallelism exchanges the "
               "tokens by all-to-all (\"alltoall\")");
    FSDP_CHECK(!r.ddp.nccl_ub, ConfigError, "'ddp.nccl_ub' with 'model.expert_model_parallel_size' ",
               ep, " is not supported: the experts are sharded over another group than the "
               "registered buffers'");
  }
  FSDP_CHECK(m.moe_router_topk <= m.num_moe_experts, ConfigError, "'model.moe_router_topk' (",
             m.moe_router_topk, ") must not exceed 'model.num_moe_experts' (", m.num_moe_experts,
             ")");
  FSDP_CHECK(m.tensor_model_parallel_size == 1 || m.sequence_parallel, ConfigError,
             "'model.tensor_model_parallel_size' ", m.tensor_model_parallel_size,
             " with 'model.num_moe_experts' ", m.num_moe_experts, " needs "
             "'model.sequence_parallel' true: the MoE layers run whole on every tensor-parallel "
             "rank, each on its part of the sequence");
  FSDP_CHECK(!r.train.cuda_graphs, ConfigError, "'train.cuda_graphs' with 'model.num_moe_experts' "
             "is not supported: the MoE layer reads its expert counts on the host every forward");
}

void check_batches(const TrainSection& t) {
  FSDP_CHECK(t.global_batch_size % t.micro_batch_size == 0, ConfigError,
             "'train.global_batch_size' (", t.global_batch_size,
             ") must be a multiple of 'train.micro_batch_size' (", t.micro_batch_size, ")");
}

void check_schedule(const Recipe& r) {
  const SchedulerSection& s = r.scheduler;
  FSDP_CHECK(r.optimizer.min_lr <= r.optimizer.lr, ConfigError, "'optimizer.min_lr' (",
             r.optimizer.min_lr, ") must not exceed 'optimizer.lr' (", r.optimizer.lr, ")");
  FSDP_CHECK(s.lr_warmup_iters <= s.lr_decay_iters, ConfigError, "'scheduler.lr_warmup_iters' (",
             s.lr_warmup_iters, ") must not exceed 'scheduler.lr_decay_iters' (", s.lr_decay_iters,
             "; 0 means train.train_iters)");
  if (s.lr_decay_style == "WSD") {
    FSDP_CHECK(s.lr_wsd_decay_iters >= 1, ConfigError,
               "'scheduler.lr_decay_style' \"WSD\" needs 'scheduler.lr_wsd_decay_iters' >= 1, "
               "the length of its final decay phase");
    FSDP_CHECK(s.lr_wsd_decay_iters <= s.lr_decay_iters - s.lr_warmup_iters, ConfigError,
               "'scheduler.lr_wsd_decay_iters' (", s.lr_wsd_decay_iters,
               ") must fit after the warmup: at most 'scheduler.lr_decay_iters' - "
               "'scheduler.lr_warmup_iters' = ", s.lr_decay_iters - s.lr_warmup_iters);
  }
}

// A log file name must stay inside run.output_dir: relative, without "..".
void check_log_file(const std::optional<std::string>& name, const char* key) {
  if (!name) return;
  FSDP_CHECK(!name->empty(), ConfigError, "'", key, "' is empty (null turns it off)");
  FSDP_CHECK(name->front() != '/', ConfigError, "'", key, "' = \"", *name,
             "\" must be a path inside run.output_dir, not an absolute path");
  size_t start = 0;
  while (start <= name->size()) {
    const size_t end = std::min(name->find('/', start), name->size());
    FSDP_CHECK(name->compare(start, end - start, "..") != 0, ConfigError, "'", key, "' = \"",
               *name, "\" must stay inside run.output_dir (no \"..\")");
    start = end + 1;
  }
}

// FP8 weight gathers: only ZeRO-3 gathers weights in its forward, and the gathered FP8 bytes
// are the weights' only form there, so every product of the FP8 layers must run in FP8.
void check_fp8_param(const Recipe& r) {
  const std::string& strategy = r.ddp.data_parallel_sharding_strategy;
  FSDP_CHECK(strategy == "optim_grads_params" || strategy == "3", ConfigError,
             "'mixed_precision.fp8_param' gathers weights in FP8 under ZeRO-3, but "
             "'ddp.data_parallel_sharding_strategy' is \"", strategy, "\" (it gathers no weights "
             "before each use); use \"optim_grads_params\" or fp8_param false");
  FSDP_CHECK(!r.optimizer.cpu_offload, ConfigError, "'mixed_precision.fp8_param' with "
             "'optimizer.cpu_offload' is not supported (the FP8 shards are made on the device "
             "after the update); set one of them false");
  const int64_t tokens = r.train.micro_batch_size * r.model.seq_length /
                         std::max(1, r.model.context_parallel_size);
  FSDP_CHECK(tokens % 16 == 0, ConfigError, "'mixed_precision.fp8_param': a micro-batch holds ",
             tokens, " tokens per rank ('train.micro_batch_size' x 'model.seq_length' / "
             "'model.context_parallel_size'), not a multiple of 16, so the FP8 products cannot "
             "run on the FP8 weights; change the sizes or set fp8_param false");
}

void check_fp8(const Recipe& r) {
  const MixedPrecisionSection& mp = r.mixed_precision;
  FSDP_CHECK(!mp.fp8_param || mp.fp8, ConfigError, "'mixed_precision.fp8_param' gathers the "
             "weights of FP8 layers in FP8, but 'mixed_precision.fp8' is null (no layer runs in "
             "FP8); set fp8 to \"e4m3\" or \"hybrid\", or fp8_param false");
  FSDP_CHECK(!mp.fp8_classifier || mp.fp8, ConfigError, "'mixed_precision.fp8_classifier' runs "
             "the output head in FP8 with the blocks' recipe, but 'mixed_precision.fp8' is null; "
             "set fp8 to \"e4m3\" or \"hybrid\", or fp8_classifier false");
  if (!mp.fp8) return;
  FSDP_CHECK(mp.fp8_recipe == "tensorwise" || mp.fp8_recipe == "delayed" ||
                 mp.fp8_recipe == "blockwise" || mp.fp8_recipe == "rowwise",
             ConfigError, "'mixed_precision.fp8_recipe' \"", mp.fp8_recipe, "\" is not "
             "available in this build; use \"tensorwise\", \"delayed\", \"blockwise\" or "
             "\"rowwise\"");
  // The first step scales from current amaxes and later ones from the history: a graph
  // captured in the first step would replay the first step's way forever.
  FSDP_CHECK(mp.fp8_recipe != "delayed" || !r.train.cuda_graphs, ConfigError,
             "'train.cuda_graphs' with 'mixed_precision.fp8_recipe' \"delayed\" is not "
             "supported (the first step, with no amax history yet, quantizes differently from "
             "the later ones a graph would replay); use fp8_recipe \"tensorwise\" or "
             "train.cuda_graphs=false");
  // FP8 weight gathers carry one scale per weight; blockwise scales every 128x128 block,
  // rowwise every row (and every column for the input gradient's product).
  FSDP_CHECK(!mp.fp8_param || (mp.fp8_recipe != "blockwise" && mp.fp8_recipe != "rowwise"),
             ConfigError, "'mixed_precision.fp8_param' with 'mixed_precision.fp8_recipe' \"",
             mp.fp8_recipe, "\" is not supported (the weights are gathered in FP8 with one "
             "scale each, ", mp.fp8_recipe, " scales ",
             mp.fp8_recipe == "blockwise" ? "each 128x128 block" : "each row and column",
             "); set fp8_param false or use fp8_recipe \"tensorwise\" or \"delayed\"");
  if (mp.fp8_param) check_fp8_param(r);
}

void check_precision(const Recipe& r) {
  check_fp8(r);
  const MixedPrecisionSection& mp = r.mixed_precision;
  bool narrow = mp.grad_reduce_dtype == "bf16";
  FSDP_CHECK(!(narrow && r.ddp.grad_reduce_in_fp32), ConfigError,
             "'mixed_precision.grad_reduce_dtype' is \"bf16\" but 'ddp.grad_reduce_in_fp32' is "
             "true; set one of them");
  FSDP_CHECK(!r.optimizer.cpu_offload || r.optimizer.optimizer == "adamw", ConfigError,
             "'optimizer.cpu_offload' supports 'optimizer.optimizer' \"adamw\" only, not \"",
             r.optimizer.optimizer, "\"");
  FSDP_CHECK(r.optimizer.muon_adamw_lr == 0 || r.optimizer.lr > 0, ConfigError,
             "'optimizer.muon_adamw_lr' (", r.optimizer.muon_adamw_lr,
             ") scales the schedule of 'optimizer.lr', which must then be above 0");
  FSDP_CHECK(r.optimizer.moments_dtype != "f64" || mp.main_params_dtype == "f64", ConfigError,
             "'optimizer.moments_dtype' \"f64\" needs 'mixed_precision.main_params_dtype' "
             "\"f64\", not \"", mp.main_params_dtype, "\"");
  FSDP_CHECK(!r.logger.log_update_norms || !r.optimizer.cpu_offload, ConfigError,
             "'logger.log_update_norms' cannot be used with 'optimizer.cpu_offload' (the master "
             "weights it compares live in host memory); set one of them false");
  FSDP_CHECK(!r.optimizer.overlap_cpu_offload || r.optimizer.cpu_offload, ConfigError,
             "'optimizer.overlap_cpu_offload' is true but 'optimizer.cpu_offload' is false");
  FSDP_CHECK(!r.optimizer.overlap_cpu_offload ||
                 r.ddp.data_parallel_sharding_strategy == "optim_grads_params",
             ConfigError, "'optimizer.overlap_cpu_offload' needs "
             "'ddp.data_parallel_sharding_strategy' \"optim_grads_params\" (ZeRO-3, whose "
             "forward gathers each unit's weights and can wait for each), not \"",
             r.ddp.data_parallel_sharding_strategy, "\"");
}

// train.cuda_graphs: what can be told from the recipe alone (runtime/train/cuda_graph.h
// checks the rest once the world is known).
void check_cuda_graphs(const Recipe& r) {
  if (!r.train.cuda_graphs) return;
  FSDP_CHECK(r.dist.device != "cpu", ConfigError,
             "'train.cuda_graphs' is true but 'dist.device' is \"cpu\": CUDA graphs need a GPU "
             "(set train.cuda_graphs=false)");
  FSDP_CHECK(r.ddp.data_parallel_sharding_strategy == "no_shard", ConfigError,
             "'train.cuda_graphs' supports 'ddp.data_parallel_sharding_strategy' \"no_shard\" "
             "only, not \"", r.ddp.data_parallel_sharding_strategy,
             "\": the other strategies gather weights or reduce gradients inside each "
             "micro-batch's forward/backward, on side streams ordered by host-side events that a "
             "graph replay would skip");
}

void check_paths(const Recipe& r) {
  FSDP_CHECK(!r.dataset.train_path.empty(), ConfigError, "'dataset.train_path' is empty");
  FSDP_CHECK(!r.run.output_dir.empty(), ConfigError, "'run.output_dir' is empty");
  FSDP_CHECK(!r.checkpoint.save || !r.checkpoint.save->empty(), ConfigError,
             "'checkpoint.save' is empty; use null to disable saving");
  FSDP_CHECK(!r.checkpoint.load || !r.checkpoint.load->empty(), ConfigError,
             "'checkpoint.load' is empty; use null to start fresh");
  check_log_file(r.logger.metrics_file, "logger.metrics_file");
  check_log_file(r.logger.samples_file, "logger.samples_file");
}

}  // namespace

void check_consistency(const Recipe& r) {
  check_model(r.model);
  check_model_parallel(r);
  check_moe(r);
  check_batches(r.train);
  check_schedule(r);
  check_precision(r);
  check_cuda_graphs(r);
  FSDP_CHECK(r.dist.dp_shard == -1 || r.dist.dp_shard >= 1, ConfigError,
             "'dist.dp_shard' must be -1 (fill the world) or >= 1, got ", r.dist.dp_shard);
  check_paths(r);
}

}  // namespace fsdp::train
