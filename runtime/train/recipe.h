// Recipe: the typed, validated configuration of one training run.
//
// A recipe is read from a JSON file with Megatron-Bridge's section and key names, then
// patched by "section.key=VALUE" overrides from the command line. Every key, its type,
// default, allowed values and help live in one schema table (recipe_schema.cc); that table
// drives parsing, defaults, range checks, --help and the dry-run print, so they cannot
// drift apart. The rest of the runtime reads this struct, never raw JSON.
//
// Errors are ConfigError (bad keys, types, values, JSON syntax; the message names the file
// and the full key path) or IoError (a file that cannot be read or written).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

struct ModelSection {
  std::string family;                // "gpt2" | "llama"
  int n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;                 // resolved: never 0 after loading (0 in JSON = n_head)
  int d_model = 0;
  int d_ff = 0;                      // resolved: never 0 after loading
  int vocab_size = 0;
  int padded_vocab_size = 0;         // resolved: never 0 after loading
  int seq_length = 0;
  bool tie_embeddings = false;
  double norm_eps = 0;
  double rope_theta = 0;
  double init_std = 0;
  bool fp32_residual_connection = false;
  std::string activation_recompute;  // "none" | "full" | "selective"
  int64_t recompute_num_layers = -1;  // full: the first N blocks (-1: all)
  int classifier_chunk_rows = 0;     // tokens per chunk of the fused head + loss; 0 = one chunk
  // Parallelisms inside a layer (Megatron-Bridge's names); data parallelism takes the rest
  // of the world: world / (tensor_model_parallel_size * context_parallel_size).
  int tensor_model_parallel_size = 0;
  bool sequence_parallel = false;
  int context_parallel_size = 0;
  std::string cp_comm_type;          // "p2p" | "all_gather"
  // Mixture of experts (Megatron-Bridge's names; models::ModelConfig documents them).
  int num_moe_experts = 0;           // 0 = dense
  int moe_router_topk = 0;
  int moe_ffn_hidden_size = 0;       // 0 = d_ff
  int moe_shared_expert_intermediate_size = 0;
  int moe_layer_freq = 0;
  int moe_first_k_dense_replace = 0;
  std::string moe_router_score_function;       // "softmax" | "sigmoid"
  bool moe_router_normalize = true;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 0;
  std::string moe_router_load_balancing_type;  // "aux_loss" | "seq_aux_loss" | "none"
  double moe_aux_loss_coeff = 0;
  double moe_z_loss_coeff = 0;
  std::string moe_token_dispatcher_type;       // "alltoall" | "allgather" (expert parallelism)
  bool moe_shared_expert_overlap = false;
  int expert_model_parallel_size = 0;
};

struct TokenizerSection {
  std::string type;                  // "gpt2_bpe"
  std::string vocab_file;
  std::string merges_file;
};

struct DatasetSection {
  std::string type;                  // "text" | "llmc" | "megatron"
  std::string train_path;            // a file, a glob, or a Megatron prefix
  std::optional<std::string> val_path;
  int64_t seed = 0;
  double val_fraction = 0;           // held out from the training data's tail (every format)
  bool shuffle = true;               // training samples in a seeded permutation per epoch
};

struct TrainSection {
  int64_t train_iters = 0;
  int micro_batch_size = 0;
  int64_t global_batch_size = 0;     // sequences per optimizer step; 0 = micro_batch_size × dp
  int64_t eval_interval = 0;         // 0 = never
  int64_t eval_iters = 0;
  bool cuda_graphs = false;          // replay each micro-batch's forward+backward as a CUDA graph
  bool matmul_tuning = true;         // CUDA: time cuBLASLt's candidate algorithms per shape
};

struct OptimizerSection {
  std::string optimizer;             // "adamw" | "muon" | "sgd"
  double lr = 0;
  double min_lr = 0;
  double weight_decay = 0;
  double adam_beta1 = 0;
  double adam_beta2 = 0;
  double adam_eps = 0;
  double clip_grad = 0;              // 0 = no clipping
  std::string moments_dtype;         // "f32" | "bf16" | "f64"
  bool cpu_offload = false;
  bool overlap_cpu_offload = false;  // ZeRO-3: the host update runs beside the next forward
  // Muon (optimizer "muon"): Megatron's keys.
  double muon_momentum = 0;
  bool muon_use_nesterov = true;
  int muon_num_ns_steps = 0;
  std::string muon_scale_mode;       // "match_rms_adamw" | "original"
  bool muon_split_qkv = true;
  double muon_adamw_lr = 0;          // the AdamW part's peak learning rate; 0 = lr
};

struct SchedulerSection {
  std::string lr_decay_style;        // "constant" | "linear" | "cosine" | "WSD"
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;        // resolved: never 0 after loading (0 in JSON = train_iters)
  int64_t lr_wsd_decay_iters = 0;
  std::string lr_wsd_decay_style;    // "linear" | "cosine" | "exponential" | "minus_sqrt"
};

struct MixedPrecisionSection {
  std::string compute_dtype;         // "auto" until resolve_device(), then "bf16" | "f32" | "f64"
  std::string main_params_dtype;     // "f32" | "f64"
  std::string grad_reduce_dtype;     // "auto" until resolve_device(), then "bf16" | "f32" | "f64"
  std::optional<std::string> fp8;    // null | "e4m3" | "hybrid"
  std::string fp8_recipe;            // "tensorwise" | "delayed" | "blockwise" | "rowwise"
  int fp8_amax_history_len = 0;      // delayed recipe
  std::string fp8_amax_compute_algo; // "most_recent" | "max" (delayed recipe)
  int fp8_margin = 0;                // delayed recipe
  bool fp8_param = false;
  bool first_last_layers_bf16 = true;
  bool fp8_classifier = false;       // the output head's products in FP8 too
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
};

struct DdpSection {
  std::string data_parallel_sharding_strategy;  // "no_shard" | "optim" | "optim_grads" | "optim_grads_params"
  bool grad_reduce_in_fp32 = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool average_in_collective = false;
  int prefetch_units = 0;
  double max_inflight_reduce_mb = 0;
  std::string unit;                  // "block"
  int blocks_per_unit = 1;           // consecutive blocks in one unit (one collective each)
  bool nccl_ub = false;              // NCCL user-buffer registration (CUDA)
  std::string nccl_ub_registration;  // "symmetric" | "local"
};

struct DistSection {
  std::string device;                // "auto" until resolve_device(), then "cpu" | "cuda"
  std::string backend;               // "auto" until resolve_device(), then "nccl" | "mpi" | "staged"
  int dp_outer = 0;
  int dp_shard = 0;                  // -1 until resolve_world(): fills the world
  double distributed_timeout_minutes = 0;
};

struct CheckpointSection {
  std::optional<std::string> save;   // directory, or nullopt: never save
  std::optional<std::string> load;   // directory, "latest" (the save dir's latest), or nullopt
  int64_t save_interval = 0;         // 0 = only at the end and on signals
  int most_recent_k = 0;             // 0 = keep all
  bool continue_on_save_failure = false;  // a failed interval save warns instead of ending the run
  bool overwrite = false;            // a run not resumed from `save` may replace its checkpoints
};

struct LoggerSection {
  int64_t log_interval = 0;
  std::optional<std::string> metrics_file;  // relative to run.output_dir; nullopt = none
  std::optional<std::string> samples_file;  // relative to run.output_dir; nullopt = none
  std::optional<std::string> tensorboard_dir;  // event files go to DIR/run.name; nullopt = none
  bool log_update_norms = false;            // per tensor group, in metrics_file
  bool log_expert_tokens = false;           // per MoE layer and expert, in metrics_file
};

struct RunSection {
  std::string name;
  std::string output_dir;
  int64_t seed = 0;
};

struct Recipe {
  ModelSection model;
  TokenizerSection tokenizer;
  DatasetSection dataset;
  TrainSection train;
  OptimizerSection optimizer;
  SchedulerSection scheduler;
  MixedPrecisionSection mixed_precision;
  DdpSection ddp;
  DistSection dist;
  CheckpointSection checkpoint;
  LoggerSection logger;
  RunSection run;

  // Every key at its schema default, derived values resolved (the recipe of an empty file).
  Recipe();

  // The resolved recipe as pretty JSON, sections and keys in schema order. Loading it back
  // gives an equal recipe.
  std::string to_json_string() const;
  // Writes to_json_string() to `path` (the trainer's run_config.json). Throws IoError.
  void write_resolved(const std::string& path) const;
  // Every key and its value, aligned and grouped by section, for --dry-run.
  std::string summary() const;

  // Settles the "auto" choices once the device is known: dist.device, dist.backend,
  // compute_dtype and grad_reduce_dtype. Throws ConfigError when dist.device is "cuda" but
  // none is available, or the backend cannot move the device's buffers.
  void resolve_device(bool cuda_available);
  // Fills dist.dp_shard = -1 from the world size, checks dp_outer × dp_shard × tp ==
  // world_size and then validate_world(). Throws ConfigError naming the keys.
  void resolve_world(int world_size);
  // Checks that global_batch_size is a multiple of micro_batch_size × dp_size.
  void validate_world(int dp_size) const;
  // Micro-batches each rank runs per optimizer step at this data-parallel size.
  int64_t grad_accum_steps(int dp_size) const;
};

// Reads a JSON recipe file, applies `overrides` ("a.b=VALUE" each), resolves derived values
// and validates everything. Throws ConfigError (IoError if the file cannot be read).
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// The first key (in schema order, leaving out the keys in `ignore`) whose values differ, as
// "key (a vs b)", or "" if the recipes agree.
std::string first_difference(const Recipe& a, const Recipe& b,
                             const std::vector<std::string>& ignore = {});

// The same from JSON text; `source` names it in error messages (e.g. a file name).
Recipe parse_recipe(const std::string& json_text, const std::vector<std::string>& overrides = {},
                    const std::string& source = "<recipe>");

// Every key of the schema with its type, default, allowed values and help, for --help.
std::string recipe_help_text();

}  // namespace fsdp::train
