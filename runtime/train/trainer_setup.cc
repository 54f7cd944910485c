#include "runtime/train/trainer_setup.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/parallel/context_parallel.h"
#include "runtime/parallel/fp8_gather.h"
#include "runtime/parallel/tensor_parallel.h"

namespace fsdp::train {

models::ModelConfig model_config_of(const Recipe& r) {
  models::ModelConfig c;
  c.family = models::family_from_name(r.model.family);
  c.n_layer = r.model.n_layer;
  c.d_model = r.model.d_model;
  c.n_head = r.model.n_head;
  c.n_kv_head = r.model.n_kv_head;
  c.d_ff = r.model.d_ff;
  c.vocab_size = r.model.vocab_size;
  c.padded_vocab_size = r.model.padded_vocab_size;
  c.seq_len = r.model.seq_length;
  c.norm_eps = r.model.norm_eps;
  c.rope_theta = r.model.rope_theta;
  c.init_std = r.model.init_std;
  c.tie_embeddings = r.model.tie_embeddings;
  c.fp32_residual_connection = r.model.fp32_residual_connection;
  c.classifier_chunk_rows = r.model.classifier_chunk_rows;
  c.num_moe_experts = r.model.num_moe_experts;
  c.moe_router_topk = r.model.moe_router_topk;
  c.moe_ffn_hidden_size = r.model.moe_ffn_hidden_size;
  c.moe_shared_expert_intermediate_size = r.model.moe_shared_expert_intermediate_size;
  c.moe_layer_freq = r.model.moe_layer_freq;
  c.moe_first_k_dense_replace = r.model.moe_first_k_dense_replace;
  c.moe_router_score_function = r.model.moe_router_score_function;
  c.moe_router_normalize = r.model.moe_router_normalize;
  c.moe_router_enable_expert_bias = r.model.moe_router_enable_expert_bias;
  c.moe_router_load_balancing_type = r.model.moe_router_load_balancing_type;
  c.moe_aux_loss_coeff = r.model.moe_aux_loss_coeff;
  c.moe_z_loss_coeff = r.model.moe_z_loss_coeff;
  return c.resolved();
}

void check_offload_device(const Recipe& r, bool offload_on_cpu) {
  FSDP_CHECK(!r.optimizer.cpu_offload || device_type_of(r) == DeviceType::CUDA || offload_on_cpu,
             ConfigError, "optimizer.cpu_offload needs dist.device=cuda (on the CPU every buffer "
             "is in host memory already)");
}

FsdpOptions fsdp_options_of(const Recipe& r) {
  FsdpOptions o;
  o.strategy = strategy_from_name(r.ddp.data_parallel_sharding_strategy);
  o.compute_dtype = dtype_from_name(r.mixed_precision.compute_dtype);
  o.main_dtype = dtype_from_name(r.mixed_precision.main_params_dtype);
  // Backward accumulates in f32 when asked (and always on the CPU, where f32 is the compute
  // dtype); the reductions run in the resolved grad_reduce_dtype.
  const bool gpu = device_type_of(r) == DeviceType::CUDA;
  o.grad_dtype = gpu && !r.ddp.grad_reduce_in_fp32 ? o.compute_dtype
                 : o.compute_dtype == DType::f64  ? DType::f64
                                                  : DType::f32;
  o.reduce_dtype = dtype_from_name(r.mixed_precision.grad_reduce_dtype);
  o.average_in_collective = r.ddp.average_in_collective;
  o.prefetch_units = r.ddp.prefetch_units;
  o.max_inflight_reduce_bytes = int64_t(r.ddp.max_inflight_reduce_mb * 1024 * 1024);
  o.unit_kind = unit_kind_from_name(r.ddp.unit);
  o.blocks_per_unit = r.ddp.blocks_per_unit;
  o.seed = uint64_t(r.run.seed);
  o.overlap_gather = r.ddp.overlap_param_gather;
  o.overlap_reduce = r.ddp.overlap_grad_reduce;
  o.offload_main = r.optimizer.cpu_offload;
  // fp8_param: the FP8 layers' weights are gathered as FP8 bytes.
  if (r.mixed_precision.fp8 && r.mixed_precision.fp8_param) o.gather_codec = std::make_shared<Fp8GatherCodec>();
  // The MPI backend registers nothing: on the CPU the option would only round buffers up.
  o.nccl_ub = r.ddp.nccl_ub && gpu;
  o.nccl_ub_kind = buffer_registration_from_name(r.ddp.nccl_ub_registration);
  return o;
}

models::Recompute recompute_of(const Recipe& r) {
  return models::recompute_from_name(r.model.activation_recompute);
}

DeviceType device_type_of(const Recipe& r) {
  FSDP_CHECK(r.dist.device == "cpu" || r.dist.device == "cuda", ConfigError, "'dist.device' is \"",
             r.dist.device, "\": resolve the recipe's device first");
  return r.dist.device == "cuda" ? DeviceType::CUDA : DeviceType::CPU;
}

OptimizerConfig optimizer_config_of(const Recipe& r) {
  OptimizerConfig c;
  c.kind = optimizer_kind_from_name(r.optimizer.optimizer);
  c.beta1 = r.optimizer.adam_beta1;
  c.beta2 = r.optimizer.adam_beta2;
  c.eps = r.optimizer.adam_eps;
  c.weight_decay = r.optimizer.weight_decay;
  c.moments_dtype = dtype_from_name(r.optimizer.moments_dtype);
  c.muon.momentum = r.optimizer.muon_momentum;
  c.muon.nesterov = r.optimizer.muon_use_nesterov;
  c.muon.newton_schulz.steps = r.optimizer.muon_num_ns_steps;
  c.muon.scale = r.optimizer.muon_scale_mode == "original" ? MuonScale::original : MuonScale::match_rms_adamw;
  // The AdamW part follows the schedule scaled (recipe_checks: lr > 0 when it is set).
  if (r.optimizer.muon_adamw_lr > 0) c.adamw_lr_ratio = r.optimizer.muon_adamw_lr / r.optimizer.lr;
  return c;
}

MeshSizes mesh_sizes_of(const Recipe& r) {
  return {r.dist.dp_outer, r.dist.dp_shard, r.model.context_parallel_size,
          r.model.expert_model_parallel_size, r.model.tensor_model_parallel_size};
}

data::DataSpec train_data_of(const Recipe& r) {
  data::DataSpec s;
  s.format = data::parse_data_format(r.dataset.type);
  s.path = r.dataset.train_path;
  s.vocab_file = r.tokenizer.vocab_file;
  s.merges_file = r.tokenizer.merges_file;
  s.shuffle = r.dataset.shuffle;
  s.label = "training data (dataset.train_path)";
  if (!r.dataset.val_path && r.dataset.val_fraction > 0) {
    s.split = data::DataSplit::head;
    s.holdout_fraction = r.dataset.val_fraction;
    s.label = str_cat("training split (dataset.train_path less its last dataset.val_fraction = ",
                      r.dataset.val_fraction, ")");
  }
  return s;
}

data::DataSpec val_data_of(const Recipe& r, bool* has_val) {
  data::DataSpec s = train_data_of(r);
  s.shuffle = false;  // the first eval_iters batches, the same at every evaluation
  *has_val = true;
  if (r.dataset.val_path) {
    s.path = *r.dataset.val_path;
    s.split = data::DataSplit::all;
    s.holdout_fraction = 0;
    s.label = "validation data (dataset.val_path)";
  } else if (r.dataset.val_fraction > 0) {
    s.split = data::DataSplit::tail;
    s.label = str_cat("validation split (the last dataset.val_fraction = ", r.dataset.val_fraction,
                      " of dataset.train_path)");
  } else {
    *has_val = false;
  }
  return s;
}

void apply_model_parallel(models::LanguageModel& model, const Recipe& r,
                          const ModelParallelGroups& groups) {
  const nn::LayerTable table = model.layer_table();
  if (groups.tensor)
    apply_tensor_parallel(model, model.vocabulary_tables(), table, *groups.tensor,
                          r.model.sequence_parallel);
  if (groups.context)
    apply_context_parallel(model, model.vocabulary_tables(), table, *groups.context,
                           r.model.seq_length, context_parallel_comm(r.model.cp_comm_type));
  if (groups.expert) apply_expert_parallel(model, table, *groups.expert);
}

Fp8Plan fp8_plan_of(const Recipe& r) {
  const MixedPrecisionSection& mp = r.mixed_precision;
  FSDP_CHECK(mp.fp8.has_value(), ConfigError, "fp8_plan_of: 'mixed_precision.fp8' is null");
  Fp8Plan plan;
  plan.recipe.backward = *mp.fp8 == "hybrid" ? kernels::Fp8Format::e5m2 : kernels::Fp8Format::e4m3;
  if (mp.fp8_recipe == "blockwise") plan.recipe.scaling = nn::Fp8Scaling::blockwise;
  if (mp.fp8_recipe == "rowwise") plan.recipe.scaling = nn::Fp8Scaling::rowwise;
  plan.bf16_first_blocks = mp.first_last_layers_bf16 ? mp.num_layers_at_start_in_bf16 : 0;
  plan.bf16_last_blocks = mp.first_last_layers_bf16 ? mp.num_layers_at_end_in_bf16 : 0;
  plan.classifier = mp.fp8_classifier;
  // Each weight cast once per step where FSDP keeps the whole weights between updates. Not
  // under ZeRO-3 (two bytes per element held for the step would undo its sharding; with
  // fp8_param it gathers FP8 bytes anyway), nor with CUDA graphs (a replay repeats the
  // captured micro-batch's casts, or misses them).
  plan.recipe.cache_weight = r.ddp.data_parallel_sharding_strategy != "optim_grads_params" &&
                             !r.train.cuda_graphs;
  return plan;
}

std::string fp8_summary(const Recipe& r, const Fp8Report& report) {
  const MixedPrecisionSection& mp = r.mixed_precision;
  std::string bf16_blocks, bf16_layers;
  for (const std::string& b : report.bf16_blocks) bf16_blocks += (bf16_blocks.empty() ? "" : ", ") + b;
  for (const std::string& l : report.bf16_layers) bf16_layers += ", " + l;
  const std::string delayed =
      mp.fp8_recipe == "delayed"
          ? str_cat(" (amax history ", mp.fp8_amax_history_len, ", ", mp.fp8_amax_compute_algo,
                    mp.fp8_margin ? str_cat(", margin ", mp.fp8_margin) : "", ")")
          : "";
  const bool head = !report.classifier.empty();
  return str_cat("fp8: ", mp.fp8.value_or("null"), " ", mp.fp8_recipe, delayed, " in ",
                 report.fp8_layers.size() - (head ? 1 : 0), " linear layers of the blocks",
                 head ? " and the classifier (" + report.classifier + ")" : "",
                 "; bf16: embedding, ", head ? "" : "classifier, ", "attention softmax, norms",
                 bf16_blocks.empty() ? "" : ", blocks " + bf16_blocks, bf16_layers,
                 mp.fp8_param ? "; weights gathered in FP8" : "");
}

std::vector<bool> fp8_block_mask(models::LanguageModel& model) {
  std::vector<bool> mask;
  for (nn::Module* block : model.blocks()) {
    bool fp8 = false;
    for (nn::Parameter* p : block->named_parameters()) fp8 = fp8 || p->fp8.has_value();
    mask.push_back(fp8);
  }
  return mask;
}

int64_t fp8_weight_cast_bytes(models::LanguageModel& model) {
  int64_t bytes = 0;
  for (nn::Parameter* w : model.named_parameters())
    if (w->fp8 && w->fp8->recipe.cache_weight) bytes += 2 * w->numel();
  return bytes;
}

int64_t activation_bytes_estimate(const models::ModelConfig& c, int64_t micro_batch,
                                  int64_t seq_len, DType compute, models::Recompute recompute,
                                  int tp, bool sequence_parallel,
                                  const std::vector<bool>& fp8_blocks, int64_t recomputed_blocks,
                                  int cp) {
  const int64_t n = micro_batch * seq_len;  // tokens
  const int64_t C = c.d_model, F = c.d_ff, L = c.n_layer;
  const int64_t kv_heads = c.n_kv_head ? c.n_kv_head : c.n_head;
  const int64_t qkv = (c.n_head + 2 * kv_heads) * c.head_dim();
  // Rotary embeddings: attention keeps rotated copies of the queries and keys beside the
  // fused projection it also reads (nn::causal_attention). Under context parallelism the
  // packed query and key-value copies are kept instead of the projection (the qkv term).
  const bool rotary = c.family == models::Family::Llama && c.rope_theta > 0;
  const int64_t rotated = rotary && cp == 1 ? (c.n_head + kv_heads) * c.head_dim() : 0;
  const int64_t e = int64_t(dtype_size(compute));
  // The residual stream's element size (f32 beside bf16 with fp32_residual_connection).
  const int64_t r = c.fp32_residual_connection && compute == DType::bf16 ? 4 : e;
  // Saved per token and layer: the block input and the mid-block sum (the residual stream,
  // each read by a norm's backward), two norm outputs, the qkv projection, the attention
  // output (and the rotated queries and keys), the MLP hidden pre- and post-activation
  // (SwiGLU: the fused 2F projection and the F product).
  // Selective recompute keeps only the activation's input (F, or 2F for SwiGLU).
  const int64_t mlp_input = c.family == models::Family::Llama ? 2 * F : F;
  const int64_t mlp = recompute == models::Recompute::selective ? mlp_input : mlp_input + F;
  // Tensor parallelism splits qkv, the attention output and the MLP's hidden tensors; the
  // residual stream and the norms' outputs stay whole on every rank unless sequence
  // parallelism splits them too.
  const int64_t stream_parts = sequence_parallel ? tp : 1;
  int64_t layer_bytes =
      n * ((2 * C * r + 2 * C * e) / stream_parts + (qkv + rotated + C + mlp) / tp * e);
  // An MoE layer (runtime/nn/moe.cc) keeps, instead of the dense MLP's hidden tensors, each
  // token's k expert rows (the permuted input, the hidden pre- and post-activation, the
  // expert output), a shared expert's hidden tensors, and per token the router's scores and
  // the losses' gradients (E each), the choices, weights and row map (k each).
  const int64_t stat = compute == DType::f64 ? 8 : 4;
  int64_t moe_layer_bytes = layer_bytes;
  if (c.is_moe()) {
    const int64_t Fe = c.moe_ffn_hidden_size ? c.moe_ffn_hidden_size : F;
    const int64_t Fs = c.moe_shared_expert_intermediate_size;
    const int64_t k = c.moe_router_topk, E = c.num_moe_experts;
    const bool llama = c.family == models::Family::Llama;
    const bool selective = recompute == models::Recompute::selective;
    const int64_t expert = (llama ? 2 : 1) * Fe + (selective ? 0 : Fe);
    const int64_t shared = Fs > 0 ? (llama ? 2 : 1) * Fs + (selective ? 0 : Fs) : 0;
    moe_layer_bytes = n * ((2 * C * r + 2 * C * e) / stream_parts + (qkv + rotated + C) / tp * e +
                           k * (2 * C + expert) * e + shared * e + E * (2 * stat + e) +
                           k * (8 + stat));
  }
  // An FP8 block's linear layers keep FP8 copies (one byte per element) for their weight
  // gradients: of a norm output in place of it (under sequence parallelism the
  // column-parallel layers keep the rank's part of their input as in bf16, and cast it
  // again); of the attention output beside it (attention's backward reads it too); of the
  // MLP's activation in place of it (kept under selective recompute too, where the bf16
  // activation would not be; nn::mlp says why). An MoE block's experts stay
  // in bf16: only its attention changes (the MLP part is counted for the dense blocks, as
  // many of the FP8 blocks as there are).
  const int64_t norm_output = sequence_parallel ? 0 : -C * (e - 1);
  // Per block: the change from the linear layers around attention (qkv and the output
  // projection; attention itself stays bf16), and from the MLP's.
  const int64_t fp8_attention_linears = n * (norm_output + C / tp);
  const int64_t fp8_mlp_linears =
      n * (norm_output + (recompute == models::Recompute::selective ? F / tp : -F / tp * (e - 1)));
  // Per block: a recomputed one keeps only its input; another what its kind keeps.
  const bool full = recompute == models::Recompute::full;
  const int64_t recomputed = !full ? 0 : recomputed_blocks < 0 ? L : std::min(recomputed_blocks, L);
  // A block's backward holds, beside what the blocks before it keep and its own
  // activations, the gradient arriving at the block and, for SwiGLU, the gradient of the
  // MLP's fused input (2F a token; GELU's backward adds no tensor of that size). Measured on
  // CPU ranks (tests/train/memory_plan_test.cc). A recomputed block's backward holds its
  // recomputed activations whole and, beside the arriving gradient, its recomputed output
  // (autograd::recompute). The peak is the largest of these and of the forward's end
  // (every kept activation).
  const int64_t block_input = n * C * r / stream_parts;
  const int64_t arriving = n * C * e / stream_parts;
  const bool llama = c.family == models::Family::Llama;
  int64_t kept = 0, backward_peak = 0;
  for (int64_t i = 0; i < L; ++i) {
    const bool moe = c.is_moe_layer(i), fp8 = size_t(i) < fp8_blocks.size() && fp8_blocks[size_t(i)];
    int64_t whole = moe ? moe_layer_bytes : layer_bytes;
    if (fp8) whole += fp8_attention_linears + (moe ? 0 : fp8_mlp_linears);
    const int64_t Fe = moe ? (c.moe_ffn_hidden_size ? c.moe_ffn_hidden_size : F) : F;
    const int64_t rows = moe ? n * c.moe_router_topk : n;
    // The dense MLP's backward (nn::mlp) holds the gradient at the activation's input (2F
    // for SwiGLU, F for GELU; in FP8 as the fc layer's two FP8 copies, rows and columns, a
    // byte an element each) beside first the gradient at the activation's output (F; GELU's
    // is computed in the matmul's epilogue, except in FP8), then the block's input gradient
    // (C, whole under tensor parallelism).
    const int64_t f = F / tp, activation_input = llama ? 2 * f : f;
    const int64_t dense_hidden_grads =
        fp8 ? n * (2 * activation_input + std::max(f * e, C * e))
        : llama ? n * (activation_input * e + std::max(f * e, C * e))
                : n * (activation_input * e + C * e);
    const int64_t hidden_grads = moe ? (llama ? rows * 2 * Fe * e : 0) : dense_hidden_grads;
    if (i < recomputed) {
      backward_peak = std::max(backward_peak, kept + whole + hidden_grads + 2 * arriving);
      kept += block_input;
    } else {
      kept += whole;
      backward_peak = std::max(backward_peak, kept + hidden_grads + arriving);
    }
  }
  // The head and loss (nn::classifier_loss): kept from its forward into the backward, the
  // f32 head-weight gradient (Vp, C) (f64 for f64 compute) and the per-token losses; at the
  // forward's end also one (chunk, Vp) logits buffer and the gradient at the head's input
  // (n, C), both gone before the blocks' backward (the latter becomes the gradient arriving
  // at the last block). The (n, Vp) logits are never held; the embedding output is the first
  // block's input, counted with it. Tensor parallelism splits the vocabulary: Vp / tp rows.
  const int64_t chunk = c.classifier_chunk_rows == 0 ? n : std::min(c.classifier_chunk_rows, n);
  const int64_t vocab_rows = c.padded_vocab_size / tp;
  const int64_t head_kept = vocab_rows * C * stat + n * stat;
  const int64_t head_forward = chunk * vocab_rows * e + n * C * e + head_kept;
  return std::max(kept + head_forward, backward_peak + head_kept);
}

}  // namespace fsdp::train
