// The table of every recipe key. Adding a key means adding a member to a section struct in
// recipe.h and one row here; parsing, defaults, checks, --help and printing follow.
#include "runtime/train/recipe_schema.h"

namespace fsdp::train {
namespace {

// KEY(optimizer.lr) names the key "optimizer.lr" and binds it to Recipe::optimizer.lr, so a
// key's path and the member it fills cannot disagree.
#define KEY(member) FieldSpec(#member, [](Recipe& r) -> FieldRef { return &r.member; })

// One long function on purpose: it is the table of every key, one row each, read top to
// bottom like the recipe's sections.
std::vector<FieldSpec> build_schema() {
  const std::vector<std::string> dtypes_auto = {"auto", "bf16", "f32", "f64"};
  return {
      // model
      KEY(model.family).one_of({"gpt2", "llama"}).default_to("gpt2").help_text(
          "Architecture: gpt2 (LayerNorm, GELU, learned positions) or llama (RMSNorm, SwiGLU, RoPE)."),
      KEY(model.n_layer).default_to(12).at_least(1).help_text("Transformer blocks."),
      KEY(model.n_head).default_to(12).at_least(1).help_text("Attention (query) heads."),
      KEY(model.n_kv_head).default_to(0).at_least(0).help_text(
          "Key/value heads (llama grouped-query attention); 0 = n_head."),
      KEY(model.d_model).default_to(768).at_least(1).help_text("Hidden size."),
      KEY(model.d_ff).default_to(0).at_least(0).help_text(
          "MLP inner size; 0 = 4*d_model for gpt2, 2/3*4*d_model rounded up to 256 for llama."),
      KEY(model.vocab_size).default_to(50257).at_least(1).help_text("Tokenizer vocabulary size."),
      KEY(model.padded_vocab_size).default_to(0).at_least(0).help_text(
          "Embedding rows; 0 = vocab_size rounded up to a multiple of 128."),
      KEY(model.seq_length).default_to(1024).at_least(1).help_text("Tokens per sequence."),
      KEY(model.tie_embeddings).default_to(true).help_text(
          "Share the token embedding with the output head."),
      KEY(model.norm_eps).default_to(1e-5).at_least(0).help_text("Epsilon of LayerNorm/RMSNorm."),
      KEY(model.rope_theta).default_to(10000.0).at_least(0).help_text("RoPE base (llama)."),
      KEY(model.init_std).default_to(0.02).at_least(0).help_text(
          "Standard deviation of the normal weight initialization."),
      KEY(model.fp32_residual_connection).default_to(false).help_text(
          "Keep the residual stream (embedding output, block inputs and outputs) in f32 when "
          "computing in bf16, as autocast does (about half the error against float64; slower "
          "today, see docs/PERFORMANCE.md); false stores it in bf16 as llm.c and Megatron do."),
      KEY(model.activation_recompute).one_of({"none", "full", "selective"}).default_to("none")
          .help_text("Recompute activations in backward: none; full (whole blocks, keeping only "
                     "each block's input); selective (each MLP's GELU or SwiGLU output, "
                     "recomputed from its saved input: an elementwise pass, no matmul; before an FP8 "
                     "projection its one-byte FP8 copy is kept instead, cheaper than the "
                     "recompute and half the bf16 activation)."),
      KEY(model.recompute_num_layers).default_to(-1).at_least(-1).help_text(
          "With activation_recompute \"full\": recompute only the first N blocks and keep "
          "the others' activations (Megatron's recompute_method \"block\" with "
          "recompute_num_layers); the fewest blocks that fit are the fastest, and a run that "
          "does not fit names the N that would. -1: every block."),
      // 8192 = models::kDefaultClassifierChunkRows (this library does not depend on models).
      KEY(model.classifier_chunk_rows).default_to(8192).at_least(0).help_text(
          "Tokens per chunk of the output head fused with the loss: only a (chunk, "
          "padded_vocab_size) logits buffer exists at a time instead of every token's logits; "
          "0 = all tokens in one chunk."),
      KEY(model.tensor_model_parallel_size).default_to(1).at_least(1).help_text(
          "Tensor-parallel ranks (Megatron's layout: attention heads and MLP features split, "
          "consecutive ranks); the data-parallel ranks are what the world size leaves."),
      KEY(model.sequence_parallel).default_to(false).help_text(
          "With tensor parallelism, split the residual stream and the norms along the sequence "
          "between the tensor-parallel layers (less activation memory; all-gathers and "
          "reduce-scatters instead of all-reduces)."),
      KEY(model.context_parallel_size).default_to(1).at_least(1).help_text(
          "Context-parallel ranks splitting each sequence (rank r holds chunks r and "
          "2 cp - 1 - r of 2 cp, for causal load balancing); model.seq_length must divide "
          "by 2 cp."),
      KEY(model.cp_comm_type).one_of({"p2p", "all_gather"}).default_to("p2p").help_text(
          "How context-parallel attention exchanges keys and values: p2p (around a ring, one "
          "rank's per step, partial results merged by their log-sum-exps) or all_gather."),
      // mixture of experts
      KEY(model.num_moe_experts).default_to(0).at_least(0).help_text(
          "Experts per MoE layer; 0 = a dense model."),
      KEY(model.moe_router_topk).default_to(2).at_least(1).help_text(
          "Experts each token is routed to (k)."),
      KEY(model.moe_ffn_hidden_size).default_to(0).at_least(0).help_text(
          "Hidden size of each expert's MLP; 0 = model.d_ff."),
      KEY(model.moe_shared_expert_intermediate_size).default_to(0).at_least(0).help_text(
          "Hidden size of a dense shared expert every token passes through; 0 = none."),
      KEY(model.moe_layer_freq).default_to(1).at_least(1).help_text(
          "Layer i is an MoE layer when i % moe_layer_freq == 0 (and i >= "
          "moe_first_k_dense_replace); the others keep the dense MLP."),
      KEY(model.moe_first_k_dense_replace).default_to(0).at_least(0).help_text(
          "The first this many layers keep the dense MLP (DeepSeek's first_k_dense_replace)."),
      KEY(model.moe_router_score_function).one_of({"softmax", "sigmoid"}).default_to("softmax")
          .help_text("Router scores: softmax over the experts, or sigmoid per expert."),
      KEY(model.moe_router_normalize).default_to(true).help_text(
          "Divide the k chosen scores by their sum (Mixtral, Qwen3-MoE); false uses them as "
          "they are (OLMoE; Megatron's moe_router_pre_softmax)."),
      KEY(model.moe_router_enable_expert_bias).default_to(false).help_text(
          "A per-expert bias added to the scores to choose the experts (not to weight them), "
          "moved after every step toward balance (auxiliary-loss-free balancing)."),
      KEY(model.moe_router_bias_update_rate).default_to(1e-3).at_least(0).help_text(
          "The expert bias's step: bias_e += rate * sign(mean count - count_e), over the "
          "global batch's tokens."),
      KEY(model.moe_router_load_balancing_type).one_of({"aux_loss", "seq_aux_loss", "none"})
          .default_to("aux_loss").help_text(
              "Load-balancing loss: aux_loss (over each micro-batch's tokens), seq_aux_loss "
              "(per sequence, averaged) or none."),
      KEY(model.moe_aux_loss_coeff).default_to(0.0).at_least(0).help_text(
          "Weight of the load-balancing loss in the objective (reported apart from the loss)."),
      KEY(model.moe_z_loss_coeff).default_to(0.0).at_least(0).help_text(
          "Weight of the router z-loss (mean squared log-sum-exp of the router logits)."),
      KEY(model.moe_token_dispatcher_type).one_of({"alltoall", "allgather"})
          .default_to("alltoall").help_text(
              "How tokens reach experts on other ranks under expert parallelism: alltoall, the "
              "only one this build has. allgather, Megatron's other choice, is accepted "
              "only without expert parallelism, where no token travels, so that a recipe "
              "using Megatron's name and value reads unchanged."),
      KEY(model.moe_shared_expert_overlap).default_to(false).help_text(
          "Compute the shared expert while the routed tokens travel to their experts' ranks "
          "(on GPUs the all-to-alls then run on their own stream, beside the compute), "
          "instead of after the routed experts."),
      KEY(model.expert_model_parallel_size).default_to(1).at_least(1).help_text(
          "Expert-parallel ranks: each holds num_moe_experts / this many experts of every MoE "
          "layer, and the tokens reach them by all-to-all."),

      // tokenizer
      KEY(tokenizer.type).one_of({"gpt2_bpe"}).default_to("gpt2_bpe").help_text(
          "Tokenizer: GPT-2 byte-level BPE, the only one this build has. The key exists so a "
          "recipe names its tokenizer, as Megatron-Bridge's tokenizer section does (there "
          "tokenizer_type GPT2BPETokenizer), and a tokenizer this build lacks is refused by "
          "name rather than read as GPT-2's."),
      KEY(tokenizer.vocab_file).default_to("third_party/gpt2_tokenizer/encoder.json").help_text(
          "BPE vocabulary (encoder.json / vocab.json)."),
      KEY(tokenizer.merges_file).default_to("third_party/gpt2_tokenizer/vocab.bpe").help_text(
          "BPE merges (vocab.bpe / merges.txt)."),

      // dataset
      KEY(dataset.type).one_of({"text", "llmc", "megatron"}).default_to("text").help_text(
          "Data format: plain text (tokenized at start), llm.c .bin shards, Megatron .bin/.idx."),
      KEY(dataset.train_path).default_to("third_party/text/austen.txt").help_text(
          "Training data: a file, a glob of shards, or a Megatron prefix (without .bin/.idx)."),
      KEY(dataset.val_path).default_to(nullptr).help_text(
          "Validation data in the same format; null = the training data's held-out tail "
          "(dataset.val_fraction), or none when that is 0."),
      KEY(dataset.seed).default_to(1234).help_text("Seed of the sample shuffle."),
      KEY(dataset.shuffle).default_to(true).help_text(
          "Read the training samples in a seeded permutation drawn anew each epoch, over every "
          "window of every file (text, llm.c shards, Megatron samples and documents), as llm.c's "
          "and Megatron's loaders do; false = file order (for debugging: consecutive windows of "
          "one document learn less per token). Validation data is always read in file order."),
      KEY(dataset.val_fraction).default_to(0.05).at_least(0).less_than(1).help_text(
          "Fraction of the training data held out for validation when val_path is null, in "
          "every format: the last tokens of text and of llm.c shards (in sorted file order), "
          "the last whole documents of a Megatron data set. 0 = no validation without val_path."),

      // train
      KEY(train.train_iters).default_to(1000).at_least(1).help_text("Optimizer steps."),
      KEY(train.micro_batch_size).default_to(4).at_least(1).help_text(
          "Sequences per rank per forward/backward."),
      KEY(train.global_batch_size).default_to(0).at_least(0).help_text(
          "Sequences per optimizer step over all ranks; 0 = micro_batch_size * data-parallel size."),
      KEY(train.eval_interval).default_to(100).at_least(0).help_text(
          "Steps between validation runs; 0 = never."),
      KEY(train.eval_iters).default_to(10).at_least(0).help_text(
          "Global batches of validation data per evaluation (the same samples for any number of ranks)."),
      KEY(train.cuda_graphs).default_to(false).help_text(
          "Capture one micro-batch's forward and backward as a CUDA graph (after one eager "
          "warm-up micro-batch) and replay it for later micro-batches: one launch instead of "
          "hundreds, for small micro-batches where the host issuing kernels limits the step. "
          "Needs dist.device cuda and ddp.data_parallel_sharding_strategy no_shard (the other "
          "strategies gather weights or reduce-scatter gradients inside forward/backward, with "
          "host-side event bookkeeping a replay would skip). On one data-parallel rank every "
          "micro-batch is replayed; on several, the last micro-batch of each step runs eagerly "
          "(its backward all-reduces the gradients), so it needs train.global_batch_size >= 2 * "
          "micro_batch_size * data-parallel size. The graph keeps one micro-batch's activation "
          "memory reserved for the whole run."),
      KEY(train.matmul_tuning).default_to(true).help_text(
          "CUDA: time cuBLASLt's top 8 algorithms for each matmul shape the second time it "
          "runs and keep the fastest for the rest of the run (the heuristic's first choice is "
          "up to 1.25x slower on some training shapes). Timing decides, so two runs may pick "
          "different algorithms and differ in rounding; false keeps the heuristic's choice, "
          "the same in every run. No effect on the CPU."),

      // optimizer
      KEY(optimizer.optimizer).one_of({"adamw", "muon", "sgd"}).default_to("adamw").help_text(
          "Update rule. muon: Muon on the blocks' weight matrices (momentum orthogonalized by "
          "Newton-Schulz, each matrix whole even when sharded), AdamW on embeddings, head, "
          "norms, biases and MoE routers."),
      KEY(optimizer.lr).default_to(3e-4).at_least(0).help_text("Peak learning rate."),
      KEY(optimizer.min_lr).default_to(0.0).at_least(0).help_text(
          "Learning rate at the end of decay."),
      KEY(optimizer.weight_decay).default_to(0.1).at_least(0).help_text(
          "Decoupled weight decay, on matrices and embeddings only."),
      KEY(optimizer.adam_beta1).default_to(0.9).at_least(0).less_than(1).help_text(
          "Adam first-moment decay."),
      KEY(optimizer.adam_beta2).default_to(0.95).at_least(0).less_than(1).help_text(
          "Adam second-moment decay."),
      KEY(optimizer.adam_eps).default_to(1e-8).greater_than(0).help_text(
          "Adam denominator epsilon (0 would divide by zero where a second moment is 0)."),
      KEY(optimizer.clip_grad).default_to(1.0).at_least(0).help_text(
          "Clip the global gradient norm to this; 0 = no clipping."),
      KEY(optimizer.moments_dtype).one_of({"f32", "bf16", "f64"}).default_to("f32").help_text(
          "Element type of the Adam moments; f64 with mixed_precision.main_params_dtype f64 "
          "only (exact reference runs on the CPU)."),
      KEY(optimizer.cpu_offload).default_to(false).help_text(
          "Keep the main weights and Adam moments in pinned host memory and run AdamW on the "
          "host's cores (CUDA only): the GPU holds compute weights, gradients and activations; "
          "each step streams the gradients down and the new weights up in chunks. Launch "
          "without core binding (mpirun --bind-to none): the ranks of a node share its cores."),
      KEY(optimizer.overlap_cpu_offload).default_to(false).help_text(
          "With cpu_offload at ZeRO-3 (optim_grads_params): run the host's update in the "
          "background while the next step's forward runs, unit by unit in forward order (the "
          "root first): each unit's all-gather waits only for that unit's new weights. The "
          "gradients are first copied down to page-locked host memory (2 bytes per parameter "
          "of the shard with bf16 gradients), so the next backward can reuse their buffers; "
          "the device holds no second copy."),
      KEY(optimizer.muon_momentum).default_to(0.95).at_least(0).less_than(1).help_text(
          "Muon: momentum of the matrices' update (an average: m = beta m + (1 - beta) g)."),
      KEY(optimizer.muon_use_nesterov).default_to(true).help_text(
          "Muon: orthogonalize the Nesterov update beta m + (1 - beta) g instead of m."),
      KEY(optimizer.muon_num_ns_steps).default_to(5).at_least(1).help_text(
          "Muon: quintic Newton-Schulz iterations (coefficients 3.4445, -4.7750, 2.0315)."),
      KEY(optimizer.muon_scale_mode).one_of({"match_rms_adamw", "original"})
          .default_to("match_rms_adamw").help_text(
              "Muon: the update's scale by its matrix's shape. match_rms_adamw: 0.2 * "
              "sqrt(max(rows, cols)), so the update's RMS is AdamW's and AdamW's lr and weight "
              "decay carry over; original: sqrt(max(1, rows / cols)) (lr about 0.02)."),
      KEY(optimizer.muon_split_qkv).default_to(true).help_text(
          "Muon: orthogonalize the fused attention projection's q, k and v as separate "
          "matrices (false: as one)."),
      KEY(optimizer.muon_adamw_lr).default_to(0.0).at_least(0).help_text(
          "Muon: peak learning rate of the parameters AdamW updates (same schedule); "
          "0 = optimizer.lr."),

      // scheduler
      KEY(scheduler.lr_decay_style).one_of({"constant", "linear", "cosine", "WSD"})
          .default_to("cosine").help_text(
              "After warmup: constant, linear or cosine decay to min_lr, or warmup-stable-decay."),
      KEY(scheduler.lr_warmup_iters).default_to(0).at_least(0).help_text(
          "Steps of linear warmup: lr*(step+1)/lr_warmup_iters."),
      KEY(scheduler.lr_decay_iters).default_to(0).at_least(0).help_text(
          "Step at which decay reaches min_lr; 0 = train.train_iters."),
      KEY(scheduler.lr_wsd_decay_iters).default_to(0).at_least(0).help_text(
          "WSD: length of the final decay phase, ending at lr_decay_iters."),
      KEY(scheduler.lr_wsd_decay_style).one_of({"linear", "cosine", "exponential", "minus_sqrt"})
          .default_to("linear").help_text("WSD: shape of the final decay phase."),

      // mixed_precision
      KEY(mixed_precision.compute_dtype).one_of(dtypes_auto).default_to("auto").help_text(
          "Element type of weights and activations in compute; auto = bf16 on GPU, f32 on CPU."),
      KEY(mixed_precision.main_params_dtype).one_of({"f32", "f64"}).default_to("f32").help_text(
          "Element type of the main weights the optimizer updates."),
      KEY(mixed_precision.grad_reduce_dtype).one_of(dtypes_auto).default_to("auto").help_text(
          "Element type gradients are reduced in; auto = f32 if ddp.grad_reduce_in_fp32, "
          "else compute_dtype."),
      KEY(mixed_precision.fp8).one_of({"e4m3", "hybrid"}).default_to(nullptr).help_text(
          "FP8 products for the blocks' linear layers (GPU with FP8 tensor cores): e4m3 "
          "everywhere, or hybrid (e4m3 forward, e5m2 gradients); null = bf16."),
      KEY(mixed_precision.fp8_recipe).one_of({"tensorwise", "delayed", "blockwise", "rowwise"})
          .default_to("tensorwise").help_text(
          "FP8 scaling: tensorwise (one scale per tensor from its current amax), delayed "
          "(from the amaxes of earlier steps), blockwise (DeepSeek-V3's: one scale per 1x128 "
          "block of inputs and gradients, per 128x128 block of weights) or rowwise (one scale "
          "per row of each operand along each product's K; the CPU simulation only in this "
          "build)."),
      KEY(mixed_precision.fp8_amax_history_len).default_to(1).at_least(1).at_most(65536).help_text(
          "Steps of amax history each operand keeps under the delayed recipe."),
      KEY(mixed_precision.fp8_amax_compute_algo).one_of({"most_recent", "max"})
          .default_to("most_recent").help_text(
          "Delayed recipe: scale by the newest amax of the history, or by its maximum."),
      KEY(mixed_precision.fp8_margin).default_to(0).at_least(0).at_most(64).help_text(
          "Delayed recipe: scale 2^margin below the format's largest value (headroom for "
          "amaxes that grow between steps)."),
      KEY(mixed_precision.fp8_param).default_to(false).help_text(
          "ZeRO-3: all-gather the FP8 layers' weights in FP8 (one byte per element and a "
          "scale per weight) instead of bf16."),
      KEY(mixed_precision.fp8_classifier).default_to(false).help_text(
          "Run the output head's three products (logits, their input gradient, the head's "
          "weight gradient) in FP8 too, with the blocks' recipe; false keeps the head in "
          "bf16, as Transformer Engine's recipes do. A vocabulary-parallel head stays in bf16."),
      KEY(mixed_precision.first_last_layers_bf16).default_to(true).help_text(
          "Keep the first and last transformer blocks in bf16 under fp8."),
      KEY(mixed_precision.num_layers_at_start_in_bf16).default_to(1).at_least(0).help_text(
          "Blocks at the start kept in bf16 when first_last_layers_bf16."),
      KEY(mixed_precision.num_layers_at_end_in_bf16).default_to(1).at_least(0).help_text(
          "Blocks at the end kept in bf16 when first_last_layers_bf16."),

      // ddp
      KEY(ddp.data_parallel_sharding_strategy)
          .one_of({"no_shard", "optim", "optim_grads", "optim_grads_params"}, /*integer_codes=*/true)
          .default_to("optim_grads_params").help_text(
              "What is sharded over data-parallel ranks: nothing (DDP), optimizer state (ZeRO-1), "
              "+gradients (ZeRO-2), +weights (ZeRO-3); also 0..3."),
      KEY(ddp.grad_reduce_in_fp32).default_to(true).help_text(
          "Reduce gradients in fp32 even when computing in bf16."),
      KEY(ddp.overlap_grad_reduce).default_to(true).help_text(
          "Reduce-scatter each unit's gradients while backward continues."),
      KEY(ddp.overlap_param_gather).default_to(true).help_text(
          "All-gather the next unit's weights while the current one computes."),
      KEY(ddp.average_in_collective).default_to(false).help_text(
          "Average inside the collective instead of pre-scaling gradients by 1/dp."),
      KEY(ddp.prefetch_units).default_to(1).at_least(0).help_text(
          "Units whose all-gather may run ahead of compute."),
      KEY(ddp.max_inflight_reduce_mb).default_to(512.0).at_least(0).help_text(
          "Full-gradient buffers awaiting reduction, in MB (2 to 8 unit-sized buffers)."),
      KEY(ddp.unit).one_of({"block"}).default_to("block").help_text(
          "Granularity of sharding units: one transformer block each (plus the root unit), "
          "the only kind this build has (Megatron-FSDP's fsdp_unit_modules names the module "
          "types that are units; here they are always the blocks). The key exists so a "
          "recipe states its unit and any other is refused rather than ignored."),
      KEY(ddp.blocks_per_unit).default_to(1).at_least(1).help_text(
          "Consecutive blocks per sharding unit (the bucket): each unit's weights are gathered "
          "and its gradients reduced in one collective, so more blocks per unit means fewer, "
          "larger messages and more memory held gathered."),
      KEY(ddp.nccl_ub).default_to(false).help_text(
          "NCCL user-buffer registration (Megatron-FSDP's nccl_ub; CUDA only, ignored on the "
          "CPU): the shard group's all-gather and reduce-scatter buffers are allocated with "
          "ncclMemAlloc (2 MiB granules, outside the caching allocator) and registered with "
          "NCCL, so that the collectives can run zero-copy, on fewer SMs, beside the matmuls. "
          "Reduce-scatters then sum and apply 1/dp afterwards."),
      KEY(ddp.nccl_ub_registration).one_of({"symmetric", "local"}).default_to("symmetric")
          .help_text("With ddp.nccl_ub: symmetric = NCCL windows (ncclCommWindowRegister: "
                     "NCCL's symmetric kernels for all-gathers and reduce-scatters over "
                     "NVLink); local = ncclCommRegister (zero-copy ring all-gathers)."),

      // dist
      KEY(dist.device).one_of({"auto", "cpu", "cuda"}).default_to("auto").help_text(
          "Where to compute; auto = cuda when a GPU is visible, else cpu."),
      KEY(dist.backend).one_of({"auto", "nccl", "mpi", "staged"}).default_to("auto").help_text(
          "How ranks exchange data: auto = nccl on GPUs (one GPU per rank), mpi on the CPU; "
          "staged = device buffers copied through pinned host memory and moved by MPI, so "
          "several ranks may share one GPU (any layout on one GPU, at PCIe speed; no CUDA "
          "graphs)."),
      KEY(dist.dp_outer).default_to(1).at_least(1).help_text(
          "Replicas of the sharded model (HSDP outer axis)."),
      KEY(dist.dp_shard).default_to(-1).at_least(-1).help_text(
          "Ranks one model is sharded over; -1 = what the world size leaves."),
      KEY(dist.distributed_timeout_minutes).default_to(10.0).greater_than(0).at_most(525600)
          .help_text("A collective that waits longer ends the job on every rank (at most a "
                     "year)."),

      // checkpoint
      KEY(checkpoint.save).default_to(nullptr).help_text(
          "Directory to save checkpoints in; null = never save."),
      KEY(checkpoint.load).default_to("latest").help_text(
          "Checkpoint to resume from: a directory, latest (the save directory's newest, if any), "
          "or null = start fresh."),
      KEY(checkpoint.save_interval).default_to(1000).at_least(0).help_text(
          "Steps between saves; 0 = only at the end and on SIGTERM/SIGUSR1."),
      KEY(checkpoint.most_recent_k).default_to(2).at_least(0).help_text(
          "Checkpoints to keep; 0 = all."),
      KEY(checkpoint.overwrite).default_to(false).help_text(
          "A run that does not resume from checkpoint.save (started fresh, or resumed from "
          "elsewhere) is refused when that directory already holds checkpoints, since its "
          "saves would replace and prune them; true = replace them."),
      KEY(checkpoint.continue_on_save_failure).default_to(false).help_text(
          "A save that fails (a full disk, a lost mount) leaves the previous checkpoint as "
          "latest and removes what it wrote; false = the run then ends with the error, true = "
          "it warns and trains on (the last step's save must still succeed)."),

      // logger
      KEY(logger.log_interval).default_to(10).at_least(1).help_text(
          "Steps between step lines and metrics records."),
      KEY(logger.metrics_file).default_to("metrics.jsonl").help_text(
          "JSON-lines metrics file inside run.output_dir; null = none."),
      KEY(logger.samples_file).default_to(nullptr).help_text(
          "JSON-lines file inside run.output_dir naming every step's training samples in "
          "global-batch order ([epoch, index, token offset in the concatenated data files]; "
          "the offset is null for Megatron data), so that another program can replay the run "
          "on the same batches (tools/parity/curve.py); null = none."),
      KEY(logger.tensorboard_dir).default_to(nullptr).help_text(
          "Directory of TensorBoard event files, like run.output_dir relative to the working "
          "directory: DIR/<run.name>/events.out.tfevents.* with training and validation loss, "
          "lr, grad norm, tokens/s, step time, MFU and peak memory at each logged step "
          "(rank 0 writes them; runtime/train/tensorboard.h lists the tags); null = none."),
      KEY(logger.log_update_norms).default_to(false).help_text(
          "Record each step's update norm, ||new - old master weights||, per tensor group (a "
          "parameter name with its layer numbers replaced by *, e.g. h.*.attn.qkv.weight) in "
          "the metrics file (logged steps only; costs a device copy of the master-weight "
          "shards; not with optimizer.cpu_offload)."),
      KEY(logger.log_expert_tokens).default_to(false).help_text(
          "MoE models: record each step's tokens per expert (one list per MoE layer, counted "
          "over the global batch) in the metrics file as moe_expert_tokens. Shows the load "
          "balance in detail, and tells whether two runs routed every token alike."),

      // run
      KEY(run.name).default_to("fsdp").help_text("Name of the run, printed and saved."),
      KEY(run.output_dir).default_to("runs/default").help_text(
          "Directory for run_config.json, metrics and the loss picture."),
      KEY(run.seed).default_to(1234).help_text("Seed of weight initialization and dropout."),
  };
}

#undef KEY

}  // namespace

const std::vector<FieldSpec>& recipe_schema() {
  static const std::vector<FieldSpec> schema = build_schema();
  return schema;
}

const std::vector<std::pair<std::string, std::string>>& recipe_key_aliases() {
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"learning_rate", "optimizer.lr"},
      {"max_lr", "optimizer.lr"},
      {"min_learning_rate", "optimizer.min_lr"},
      {"beta1", "optimizer.adam_beta1"},
      {"beta2", "optimizer.adam_beta2"},
      {"eps", "optimizer.adam_eps"},
      {"grad_clip", "optimizer.clip_grad"},
      {"max_grad_norm", "optimizer.clip_grad"},
      {"gradient_clipping", "optimizer.clip_grad"},
      {"warmup_iters", "scheduler.lr_warmup_iters"},
      {"warmup_steps", "scheduler.lr_warmup_iters"},
      {"max_steps", "train.train_iters"},
      {"num_iterations", "train.train_iters"},
      {"batch_size", "train.micro_batch_size"},
      {"hidden_size", "model.d_model"},
      {"n_embd", "model.d_model"},
      {"num_layers", "model.n_layer"},
      {"num_attention_heads", "model.n_head"},
      {"num_query_groups", "model.n_kv_head"},
      {"num_key_value_heads", "model.n_kv_head"},
      {"ffn_hidden_size", "model.d_ff"},
      {"intermediate_size", "model.d_ff"},
      {"max_position_embeddings", "model.seq_length"},
      {"seq_len", "model.seq_length"},
      {"sequence_length", "model.seq_length"},
      {"untie_embeddings_and_output_weights", "model.tie_embeddings"},
      {"recompute_granularity", "model.activation_recompute"},
      {"recompute_num_layers", "model.recompute_num_layers"},
      {"tensor_model_parallel_size", "model.tensor_model_parallel_size"},
      {"context_parallel_size", "model.context_parallel_size"},
      {"data_path", "dataset.train_path"},
      {"save_dir", "checkpoint.save"},
      {"load_dir", "checkpoint.load"},
      {"sharding_strategy", "ddp.data_parallel_sharding_strategy"},
      {"zero_stage", "ddp.data_parallel_sharding_strategy"},
  };
  return aliases;
}

}  // namespace fsdp::train
