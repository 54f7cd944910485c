#!/usr/bin/env bash
# The GPU checks of correctness, speed and memory, in priority order, on a 2-GPU machine from
# the bundle that scripts/gpu_bundle.sh makes (no Bazel there), from the repository root:
#   1. PyTorch parity of GPT-2 d12 and a small Llama in bf16 and f32 (tools/parity)
#   2. ZeRO-3 on 2 GPUs against 1 GPU, 50 steps of GPT-2 d12 (losses compared per step);
#      the 2-GPU run saves a checkpoint
#   3. GPT-2 124M on 1 GPU (bench train), and its PyTorch + torch.compile peer
#      (tools/peer/torch_peer.py) in the same call
#   4. GPT 1.3B, ZeRO-3 on 2 GPUs, with the compute baseline (exposed communication)
#   5. Hugging Face export of the step-2 checkpoint, checked against transformers; and of a
#      tiny Mixtral-shaped MoE trained 3 steps on the CPU, in f32 and in bf16
#   6. GPT-2 124M on 2 GPUs under ZeRO-1 and ZeRO-3 (bench train)
#   7. the largest GPT that trains at ZeRO-3 on 2 GPUs (seq 2048, micro-batch 1, full
#      recompute, bf16 gradients and Adam moments): 23.0B, else 22.1B
#   8. a launch without MPI (torchrun-style variables), the NCCL tests (watchdog too), and a
#      2-GPU training job with a stuck rank (scripts/stuck_rank.sh)
#   9. CPU offload: GPT-2 d12 losses with and without it (1 GPU), and at ZeRO-3 on 2 GPUs
#      with the update overlapped or not (bitwise the same losses), GPT 1.3B ZeRO-3 speed and
#      memory with it (overlapped or not), and the largest GPT with it at ZeRO-3 on 2 GPUs
#      (24.3B, then 26.6B; OFFLOAD_EXTRA adds recipe overrides, e.g. the overlap)
#  10. device time per kernel (Nsight Compute, scripts/kernel_profile.sh) of one micro-batch
#      step of GPT-2 124M (64 x 1024) and of GPT 1.3B (16 x 2048), each on one GPU (give it
#      a few minutes: the 1.3B start-up and warm-up step run under the profiler too)
#  11. bf16 Adam moments: GPT-2 d12 losses over 300 steps with f32 and with bf16 moments
#      (1 GPU), and GPT 1.3B ZeRO-3 speed and memory with each
#  12. one GPU, the chunked classifier and CUDA graphs: GPT-2 124M with the chunked
#      classifier against the whole logits (model.classifier_chunk_rows=0), and with CUDA
#      graphs (train.cuda_graphs) at micro-batch 64 and 8
#  13. two GPUs, NCCL user-buffer registration (ddp.nccl_ub): all-gather and reduce-scatter
#      1M-256M unregistered / symmetric windows, GPT-2 124M ZeRO-1 and ZeRO-3 and GPT 1.3B
#      ZeRO-3 (with the compute baseline) without and with it
#  14. two GPUs, bucket size: GPT-2 124M at ZeRO-3 with 1, 2 and 4 blocks per unit
#  15. one GPU, FP8 against our bf16 in one call (docs/PERFORMANCE.md's FP8 rows): GPT 1.3B
#      (16 x 2048) and the Llama ~1B (8 x 2048), each in bf16, then mixed_precision.fp8=hybrid
#      with each recipe of FP8_RECIPES (default "tensorwise delayed blockwise"), then delayed
#      with the first and last blocks in FP8 too, delayed with the classifier in FP8 too,
#      then bf16 again (the machine's drift); fourteen runs of under a minute each
#  16. one GPU, the kernel benches: bench memory-bound (each workload), bench fp8-matmul and
#      bench grouped-matmul (docs/PERFORMANCE.md's kernel tables)
#  17. one GPU, Llama3-8B at seq 8192 (docs/PERFORMANCE.md, "Llama3-8B on one GPU"): FP8
#      delayed scaling, CPU offload with bf16 moments and gradients, ZeRO-3 over one rank,
#      full recompute of RECOMPUTE_8B blocks (default 4 on a GPU of at most 80 GB, else 0),
#      micro-batch 1, global batch GLOBAL_8B (default 128, the Megatron-Bridge anchor's), 3
#      timed steps after 1, the host's memory sampled; then its PyTorch peer in the same call
#      (FSDP2 with CPUOffloadPolicy and checkpointing of every block, global batch
#      PEER_GLOBAL_8B, default 8; the most blocks the host's memory holds, see torch_peer.py).
#      About 80 s a step of 128 on an H100: give it 10 minutes, or GLOBAL_8B=64; LIMIT_8B and
#      PEER_LIMIT_8B (default 560 and 400 s) bound the two runs
#  18. one GPU, the same 8B in bf16 and in FP8 at global batch GLOBAL_8B_AB (default 32), bf16
#      first, both with full recompute of RECOMPUTE_8B_AB blocks (default 8 on a GPU of at
#      most 80 GB, where bf16 with 4 does not fit, else 0): the precisions' ratio in one call
# One summary line per check; full logs in LOG_DIR (packed into LOG_DIR.tgz after each check,
# so a run stopped early keeps what finished).
#
#   FSDP_NVIDIA_LIBS=... [CHECKS="2 4"] scripts/gpu_validate.sh [BUNDLE_DIR] [LOG_DIR]
#
# CHECKS lists the checks to run by number (default: 1 to 8).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
L="${2:-${OUT:-/tmp}/gpu-validate}"
mkdir -p "$L"
B="$bundle"
work="$(mktemp -d)"
trap 'pkill -TERM -P $$; exit 143' TERM INT  # runs started with `waited` (gpu_env.sh) stop too
pack() { tar czf "$L.tgz" -C "$(dirname "$L")" "$(basename "$L")"; }
say() { echo "== $* ($(date +%T))"; }
CHECKS="${CHECKS:-1 2 3 4 5 6 7 8}"
want() { [[ " $CHECKS " == *" $1 "* ]]; }

if want 1; then
# 1. PyTorch parity
for m in gpt2-d12 llama-small; do for dt in bf16 f32; do
  d="$work/parity/${m}_$dt"
  waited timeout 60 "$B/tools/parity_dump" --model $m --device cuda --dtype $dt --batch 4 --seq 64 \
    --steps 10 --out "$d" > "$L/pdump_${m}_$dt.log" 2>&1
  waited timeout 90 python3 tools/parity/parity.py "$d" --device cuda --json "$L/parity_${m}_$dt.json" \
    > "$L/parity_${m}_$dt.txt" 2>&1
  say "parity $m $dt rc=$?"; grep -E "^RESULT" "$L/parity_${m}_$dt.txt"
done; done; pack
fi

if want 2; then
# 2. ZeRO-3 on 2 GPUs against 1 GPU
C=(--config configs/gpt2-124m.json dataset.type=text dataset.train_path=third_party/text/austen.txt
   dataset.val_path=null dataset.val_fraction=0 train.train_iters=50 train.micro_batch_size=8
   train.global_batch_size=16 train.eval_interval=0 logger.log_interval=1
   scheduler.lr_warmup_iters=10 ddp.data_parallel_sharding_strategy=optim_grads_params
   checkpoint.load=null)
waited timeout 150 "$B/tools/train" "${C[@]}" run.output_dir="$L/z3_1gpu" checkpoint.save=null \
  > "$L/z3_1gpu.log" 2>&1; say "zero3 1 gpu rc=$?"
waited timeout 150 "${MPIRUN[@]}" -np 2 "$B/tools/train" "${C[@]}" run.output_dir="$L/z3_2gpu" \
  checkpoint.save="$work/ck" > "$L/z3_2gpu.log" 2>&1; say "zero3 2 gpus rc=$?"
python3 - "$L" <<'PY'
import json, sys
d = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(d + "/z3_1gpu/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(d + "/z3_2gpu/metrics.jsonl")]
r = [abs(x - y) / abs(x) for x, y in zip(a, b)]
print("steps %d/%d, max relative difference %.3e (step %d), losses %.4f -> %.4f" %
      (len(a), len(b), max(r), r.index(max(r)) + 1, a[0], a[-1]))
PY
grep -E "predicted peak" "$L/z3_2gpu.log" | head -1; tail -1 "$L/z3_2gpu/metrics.jsonl"; pack
fi

if want 3; then
# 3. GPT-2 124M, 1 GPU
# with the residual stream in f32 (the default) and in bf16 (llm.c's numerics)
for res in true false; do
  waited timeout 150 "$B/tools/bench" train --workload gpt2-124m --steps 8 --warmup 2 \
    ddp.data_parallel_sharding_strategy=no_shard model.fp32_residual_connection=$res \
    > "$L/bench_gpt2_1gpu_res_$res.txt" 2>&1
  say "gpt2 1 gpu, fp32 residual $res rc=$?"; cat "$L/bench_gpt2_1gpu_res_$res.txt"
done
# Its peer in the same call: the same shapes in PyTorch with torch.compile.
waited timeout 300 python3 tools/peer/torch_peer.py --workload gpt2-124m > "$L/peer_gpt2_1gpu.txt" 2>&1
say "gpt2 1 gpu, PyTorch + torch.compile rc=$?"; cat "$L/peer_gpt2_1gpu.txt"; pack
fi

if want 4; then
# 4. GPT 1.3B, ZeRO-3, 2 GPUs, micro-batch 16
waited timeout 240 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt-1.3b --steps 4 --warmup 2 \
  --compute-baseline train.global_batch_size=32 > "$L/bench_1.3b.txt" 2>&1
say "gpt 1.3b rc=$?"; cat "$L/bench_1.3b.txt"; pack
# Where the exposed communication comes from: the step time with gradients reduced in bf16
# (half the reduce-scatter bytes), with two units prefetched, and with no overlap at all.
for v in ddp.grad_reduce_in_fp32=false ddp.prefetch_units=2 \
         "ddp.overlap_grad_reduce=false ddp.overlap_param_gather=false"; do
  f="$L/bench_1.3b_$(echo "$v" | tr ' =' '__').txt"
  waited timeout 120 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt-1.3b --steps 4 --warmup 2 \
    train.global_batch_size=32 $v > "$f" 2>&1
  say "gpt 1.3b, $v rc=$?"; grep -E "per GPU|MFU|step time|peak alloc" "$f"
done; pack
fi

if want 5; then
# 5. Hugging Face export of the 2-GPU checkpoint
waited timeout 150 "$B/tools/convert" export "$work/ck" "$work/hf" > "$L/export.log" 2>&1; say "export rc=$?"
waited timeout 120 python3 tools/convert/check_hf_export.py "$work/hf" > "$L/hf_check.txt" 2>&1
say "transformers check rc=$?"; tail -4 "$L/hf_check.txt"
# A Mixtral: configs/moe-tiny.json (Llama family, 8 experts, top 2) without its shared
# expert, which Mixtral has not. In bf16 the check holds the positions routed as in f32 to
# the tolerance (check_hf_export.py: a near tie in a router reroutes a token).
waited timeout 120 "$B/tools/train" --config configs/moe-tiny.json model.moe_shared_expert_intermediate_size=0 \
  dist.device=cpu train.train_iters=3 train.eval_interval=0 run.output_dir="$work/moe_run" \
  checkpoint.save="$work/moe_ck" > "$L/moe_train.log" 2>&1; say "moe train (cpu) rc=$?"
waited timeout 150 "$B/tools/convert" export "$work/moe_ck" "$work/hf_moe" > "$L/export_moe.log" 2>&1
say "mixtral export rc=$?"
for dt in float32:1e-5 bfloat16:1e-2; do
  waited timeout 180 python3 tools/convert/check_hf_export.py "$work/hf_moe" --dtype ${dt%:*} \
    --tolerance ${dt#*:} > "$L/hf_check_mixtral_${dt%:*}.txt" 2>&1
  say "transformers check mixtral ${dt%:*} rc=$?"; grep -E "^(routing|routed|max rel|argmax)" "$L/hf_check_mixtral_${dt%:*}.txt"
done; pack
fi

if want 6; then
# 6. GPT-2 124M on 2 GPUs
for st in optim optim_grads_params; do
  waited timeout 150 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt2-124m --steps 5 --warmup 2 \
    ddp.data_parallel_sharding_strategy=$st > "$L/bench_gpt2_2gpu_$st.txt" 2>&1
  say "gpt2 2 gpus $st rc=$?"; grep -E "tokens/s|MFU|peak alloc" "$L/bench_gpt2_2gpu_$st.txt"
done; pack
fi

if want 7; then
# 7. The largest GPT at ZeRO-3 on 2 GPUs: width 6144, 48 heads; 50 layers (23.0B), else 48 (22.1B)
for nl in 50 48; do
  waited timeout 240 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt-1.3b --steps 2 --warmup 1 \
    model.n_layer=$nl model.d_model=6144 model.n_head=48 model.d_ff=0 \
    model.activation_recompute=full train.micro_batch_size=1 train.global_batch_size=2 \
    optimizer.moments_dtype=bf16 ddp.grad_reduce_in_fp32=false > "$L/bench_largest_$nl.txt" 2>&1
  rc=$?; say "largest, $nl layers rc=$rc"
  grep -E "parameters|tokens/s|peak|predicted" "$L/bench_largest_$nl.txt" | head -6
  [ $rc = 0 ] && break
done; pack
fi

if want 8; then
# 8. Launch without MPI, and the NCCL tests
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
    waited timeout 60 "$B/tools/bench" collectives --min-bytes 256M --max-bytes 256M --iters 10 --rounds 1 \
    > "$L/env_launch_$r.log" 2>&1 &
done; wait; say "env launch"; grep -E "^  (all|reduce)" "$L/env_launch_0.log"
waited timeout 120 "${MPIRUN[@]}" -np 2 "$B/tests/tests_collectives__nccl_test" > "$L/nccl_test.log" 2>&1
say "nccl_test rc=$?"; grep -E "^(test cases|All tests)" "$L/nccl_test.log" | tail -1; pack
# A training job with a stuck rank (SIGSTOP) ends on every rank within the timeout
bash scripts/stuck_rank.sh "$work/stuck" "$B/tools/train" "${MPIRUN[@]:1}" -- \
  --config configs/gpt2-124m.json dataset.type=text dataset.train_path=third_party/text/austen.txt \
  dataset.val_path=null dataset.val_fraction=0 train.micro_batch_size=8 \
  train.global_batch_size=16 train.eval_interval=0 > "$L/stuck_rank.txt" 2>&1
say "stuck rank rc=$?"; tail -3 "$L/stuck_rank.txt"; cp "$work/stuck/job.log" "$L/stuck_job.log"; pack
fi
if want 9; then
# 9. CPU offload
for off in false true; do
  waited timeout 120 "$B/tools/train" --config configs/gpt2-124m.json dataset.type=text \
    dataset.train_path=third_party/text/austen.txt dataset.val_path=null dataset.val_fraction=0 \
    train.train_iters=20 train.micro_batch_size=8 train.global_batch_size=8 train.eval_interval=0 \
    logger.log_interval=1 checkpoint.save=null run.output_dir="$work/off_$off" \
    optimizer.cpu_offload=$off > "$L/offload_gpt2_$off.txt" 2>&1
  say "gpt2 d12 cpu_offload=$off rc=$?"; grep -E "optimizer state|step +20" "$L/offload_gpt2_$off.txt" | head -3
done
# The host update overlapped with the next forward (ZeRO-3): the same update; two GPU runs
# are not bitwise reproducible (step 1's gradient norm, before any overlap, differs in the
# 6th digit between runs), so the comparison is the largest relative loss difference.
for ov in false true; do
  waited timeout 120 "${MPIRUN[@]}" -np 2 "$B/tools/train" --config configs/gpt2-124m.json dataset.type=text \
    dataset.train_path=third_party/text/austen.txt dataset.val_path=null dataset.val_fraction=0 \
    train.train_iters=20 train.micro_batch_size=8 train.global_batch_size=16 train.eval_interval=0 \
    logger.log_interval=1 checkpoint.save=null run.output_dir="$L/overlap_$ov" \
    ddp.data_parallel_sharding_strategy=optim_grads_params optimizer.cpu_offload=true \
    optimizer.overlap_cpu_offload=$ov > "$L/offload_overlap_$ov.txt" 2>&1
  say "gpt2 d12 zero3 offload overlap=$ov rc=$?"
done
python3 - "$L" <<'PY'
import json, sys
L = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(f"{L}/overlap_false/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(f"{L}/overlap_true/metrics.jsonl")]
r = [abs(x - y) / abs(x) for x, y in zip(a, b)]
print("steps %d/%d, max relative loss difference %.2e, last %.6f %.6f" % (len(a), len(b), max(r), a[-1], b[-1]))
PY
for ov in false true; do
  waited timeout 200 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt-1.3b --steps 3 --warmup 1 \
    train.global_batch_size=32 optimizer.cpu_offload=true optimizer.overlap_cpu_offload=$ov \
    > "$L/bench_1.3b_offload_$ov.txt" 2>&1
  say "1.3b offload overlap=$ov rc=$?"; grep -E "tokens/s per|MFU|peak alloc|step time|optimizer " "$L/bench_1.3b_offload_$ov.txt"
done; pack
# (24.3B took 89 s to start, pinning 91 GiB of host memory per rank, and 5.8 s per step.)
for nl in ${OFFLOAD_LAYERS:-53 58}; do
  waited timeout "${OFFLOAD_LIMIT:-300}" "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --verbose \
    --workload gpt-1.3b --steps 2 --warmup 1 model.n_layer=$nl model.d_model=6144 \
    model.n_head=48 model.d_ff=0 model.activation_recompute=full train.micro_batch_size=1 \
    train.global_batch_size=2 optimizer.moments_dtype=bf16 ddp.grad_reduce_in_fp32=false \
    optimizer.cpu_offload=true logger.log_interval=1 ${OFFLOAD_EXTRA:-} 2>&1 |
    while IFS= read -r line; do echo "$(date +%T) $line"; done > "$L/bench_offload_$nl.txt"
  rc=${PIPESTATUS[0]}; say "largest with cpu offload, $nl layers rc=$rc"
  grep -E "parameters|optimizer state|tokens/s|MFU|peak|predicted|step time|optimizer " "$L/bench_offload_$nl.txt" | head -12
  free -g | head -2; pack
  [ $rc = 0 ] || break
done
fi

if want 10; then
# 10. Device time per kernel, one micro-batch per step, one GPU
bash scripts/kernel_profile.sh "${1:-.device}" "$L/profile" gpt2 1 --workload gpt2-124m --steps 1 \
  --warmup 1 train.global_batch_size=64 ddp.data_parallel_sharding_strategy=no_shard | head -40
bash scripts/kernel_profile.sh "${1:-.device}" "$L/profile" gpt1.3b 1 --workload gpt-1.3b --steps 1 \
  --warmup 1 train.global_batch_size=16 ddp.data_parallel_sharding_strategy=no_shard | head -40
pack
fi
if want 11; then
# 11. bf16 Adam moments against f32 ones: loss (GPT-2 d12, 300 steps) and speed (1.3B)
for m in f32 bf16; do
  waited timeout 150 "$B/tools/train" --config configs/gpt2-124m.json dataset.type=text \
    dataset.train_path=third_party/text/austen.txt dataset.val_path=null dataset.val_fraction=0 \
    train.train_iters=300 train.micro_batch_size=8 train.global_batch_size=16 train.eval_interval=0 \
    logger.log_interval=1 checkpoint.save=null run.output_dir="$L/moments_$m" \
    optimizer.moments_dtype=$m > "$L/moments_gpt2_$m.txt" 2>&1
  say "gpt2 d12 moments $m rc=$?"
done
python3 - "$L" <<'PY'
import json, sys
L = sys.argv[1]
a = [json.loads(l)["loss"] for l in open(f"{L}/moments_f32/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(f"{L}/moments_bf16/metrics.jsonl")]
r = [abs(x - y) / abs(x) for x, y in zip(a, b)]
tail = lambda v: sum(v[-50:]) / len(v[-50:])
print("steps %d/%d; max rel loss diff %.3e at step %d; mean of last 50: f32 %.4f bf16 %.4f"
      % (len(a), len(b), max(r), r.index(max(r)) + 1, tail(a), tail(b)))
PY
for m in f32 bf16; do
  waited timeout 150 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt-1.3b --steps 3 --warmup 1 \
    train.global_batch_size=32 optimizer.moments_dtype=$m > "$L/bench_1.3b_moments_$m.txt" 2>&1
  say "1.3b moments $m rc=$?"; grep -E "tokens/s per|peak alloc|optimizer  " "$L/bench_1.3b_moments_$m.txt"
done; pack
fi
if want 12; then
# 12. The chunked classifier and CUDA graphs, one GPU
g2() {  # name, extra bench arguments...
  local name="$1"; shift
  waited timeout 120 "$B/tools/bench" train --workload gpt2-124m --steps 8 --warmup 2 \
    ddp.data_parallel_sharding_strategy=no_shard "$@" > "$L/bench_gpt2_$name.txt" 2>&1
  say "gpt2 $name rc=$?"; grep -E "tokens/s total|MFU|peak alloc|step time|forward" "$L/bench_gpt2_$name.txt"
}
g2 chunked
g2 whole_logits model.classifier_chunk_rows=0
g2 graphs train.cuda_graphs=true
g2 mb8 train.micro_batch_size=8 train.global_batch_size=64
g2 mb8_graphs train.micro_batch_size=8 train.global_batch_size=64 train.cuda_graphs=true
pack
fi

if want 13; then
# 13. NCCL user-buffer registration, two GPUs
for r in none symmetric; do
  waited timeout 150 "${MPIRUN[@]}" -np 2 "$B/tools/bench" collectives --ops ag,rs --min-bytes 1M \
    --max-bytes 256M --register $r --check > "$L/coll_$r.txt" 2>&1
  say "collectives register=$r rc=$?"; grep -E "^ *(all_gather|reduce_scatter|all-gather|reduce-scatter)" "$L/coll_$r.txt" | head -12
done
for st in optim optim_grads_params; do for ub in false true; do
  [ $st = optim ] && [ $ub = true ] && continue
  waited timeout 120 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt2-124m --steps 4 --warmup 2 \
    ddp.data_parallel_sharding_strategy=$st ddp.nccl_ub=$ub > "$L/bench_gpt2_2gpu_${st}_ub$ub.txt" 2>&1
  say "gpt2 2 gpus $st nccl_ub=$ub rc=$?"; grep -E "tokens/s total|MFU|all-gathers|reduce-scatters" "$L/bench_gpt2_2gpu_${st}_ub$ub.txt"
done; done
for ub in false true; do
  waited timeout 180 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt-1.3b --steps 4 --warmup 2 \
    --compute-baseline train.global_batch_size=32 ddp.nccl_ub=$ub > "$L/bench_1.3b_ub$ub.txt" 2>&1
  say "1.3b nccl_ub=$ub rc=$?"; grep -E "tokens/s per|MFU|peak alloc|step time|compute|exposed|all-gathers|reduce-scatters" "$L/bench_1.3b_ub$ub.txt"
done; pack
fi
if want 14; then
# 14. Blocks per FSDP unit (the bucket of each all-gather and reduce-scatter), two GPUs
for k in 1 2 4; do
  waited timeout 120 "${MPIRUN[@]}" -np 2 "$B/tools/bench" train --workload gpt2-124m --steps 4 --warmup 2 \
    ddp.data_parallel_sharding_strategy=optim_grads_params ddp.blocks_per_unit=$k \
    > "$L/bench_gpt2_z3_units$k.txt" 2>&1
  say "gpt2 2 gpus zero3 blocks_per_unit=$k rc=$?"
  grep -E "tokens/s total|MFU|peak alloc|all-gathers|reduce-scatters" "$L/bench_gpt2_z3_units$k.txt"
done; pack
fi
if want 15; then
# 15. FP8 against bf16, one GPU, one call
fp8_bench() {  # name, workload, overrides...
  local name="$1" workload="$2"; shift 2
  waited timeout 150 "$B/tools/bench" train --workload "$workload" --steps 3 --warmup 1 \
    ddp.data_parallel_sharding_strategy=no_shard "$@" > "$L/fp8_$name.txt" 2>&1
  say "fp8 $name rc=$?"; grep -E "tokens/s|MFU|peak alloc|step time|fp8" "$L/fp8_$name.txt"
}
for w in "gpt-1.3b train.global_batch_size=32" "llama-1b train.global_batch_size=16"; do
  set -- $w
  fp8_bench "${1}_bf16" "$@"
  for r in ${FP8_RECIPES:-tensorwise delayed blockwise}; do
    fp8_bench "${1}_$r" "$@" mixed_precision.fp8=hybrid mixed_precision.fp8_recipe=$r
  done
  fp8_bench "${1}_delayed_all_blocks" "$@" mixed_precision.fp8=hybrid \
    mixed_precision.fp8_recipe=delayed mixed_precision.first_last_layers_bf16=false
  fp8_bench "${1}_delayed_classifier" "$@" mixed_precision.fp8=hybrid \
    mixed_precision.fp8_recipe=delayed mixed_precision.fp8_classifier=true
  fp8_bench "${1}_bf16_again" "$@"
done; pack
fi
if want 16; then
# 16. the kernel benches, one GPU
for w in gpt2-124m gpt-1.3b llama-1b; do
  waited timeout 120 "$B/tools/bench" memory-bound --workload $w --reps 10 > "$L/memory_bound_$w.txt" 2>&1
  say "memory-bound $w rc=$?"; cat "$L/memory_bound_$w.txt"
done
for w in gpt-1.3b llama-1b; do
  waited timeout 120 "$B/tools/bench" fp8-matmul --workload $w > "$L/fp8_matmul_$w.txt" 2>&1
  say "fp8-matmul $w rc=$?"; cat "$L/fp8_matmul_$w.txt"
done
waited timeout 120 "$B/tools/bench" grouped-matmul > "$L/grouped_matmul.txt" 2>&1
say "grouped-matmul rc=$?"; cat "$L/grouped_matmul.txt"; pack
fi
if want 17 || want 18; then
# The 8B on one GPU: the shape's recipe, its memory settings, and the host's peak memory.
gpu_mib="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)"
large_gpu=$([ "${gpu_mib:-0}" -gt 82000 ] && echo 1 || echo 0)
recompute_8b="${RECOMPUTE_8B:-$([ "$large_gpu" = 1 ] && echo 0 || echo 4)}"
llama8b=(--config configs/llama3-8b.json model.seq_length=8192 train.micro_batch_size=1
  optimizer.cpu_offload=true optimizer.moments_dtype=bf16 ddp.grad_reduce_in_fp32=false
  ddp.data_parallel_sharding_strategy=optim_grads_params model.activation_recompute=full
  logger.log_interval=1)
fp8_8b=(mixed_precision.fp8=hybrid mixed_precision.fp8_recipe=delayed)
# Runs a command and prints the host's peak memory in use (free's "used": the page cache not
# counted) above what was in use before it, sampled every 2 s: the process's own memory and
# its page-locked buffers.
host_peak() {
  local before peak=0 now
  before="$(free -b | awk '/^Mem:/ {print $3}')"
  "$@" & local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    now="$(free -b | awk '/^Mem:/ {print $3}')"
    [ "${now:-0}" -gt "$peak" ] && peak="$now"
    sleep 2
  done
  wait "$pid"; local rc=$?
  awk -v p="$peak" -v b="$before" 'BEGIN {printf "host memory in use: peak %.1f GiB above the %.1f GiB before\n", (p - b) / 2^30, b / 2^30}'
  return $rc
}
fi
if want 17; then
# 17. the 8B on one GPU, FP8, and its PyTorch peer in the same call
host_peak timeout "${LIMIT_8B:-560}" "$B/tools/bench" train "${llama8b[@]}" "${fp8_8b[@]}" \
  model.recompute_num_layers="$recompute_8b" train.global_batch_size="${GLOBAL_8B:-128}" --steps 3 --warmup 1 --verbose \
  > "$L/llama8b_fp8.txt" 2>&1
say "llama3-8b fp8, recompute $recompute_8b, global ${GLOBAL_8B:-128} rc=$?"
grep -E "tokens/s|TFLOP|MFU|peak alloc|outside|step time|host|predicted" "$L/llama8b_fp8.txt"; pack
waited timeout "${PEER_LIMIT_8B:-400}" python3 -u tools/peer/torch_peer.py --workload llama3-8b --fsdp2-cpu-offload \
  --recompute --global-batch "${PEER_GLOBAL_8B:-8}" --steps 2 --warmup 1 > "$L/peer_llama8b.txt" 2>&1
say "llama3-8b, PyTorch FSDP2 + CPUOffloadPolicy rc=$?"; tail -6 "$L/peer_llama8b.txt"; pack
fi
if want 18; then
# 18. the 8B in bf16 and in FP8, one call
recompute_ab="${RECOMPUTE_8B_AB:-$([ "$large_gpu" = 1 ] && echo 0 || echo 8)}"
for precision in bf16 fp8; do
  extra=(); [ "$precision" = fp8 ] && extra=("${fp8_8b[@]}")
  host_peak timeout 280 "$B/tools/bench" train "${llama8b[@]}" "${extra[@]}" \
    model.recompute_num_layers="$recompute_ab" train.global_batch_size="${GLOBAL_8B_AB:-32}" --steps 3 --warmup 1 > "$L/llama8b_ab_$precision.txt" 2>&1
  say "llama3-8b $precision, recompute $recompute_ab, global ${GLOBAL_8B_AB:-32} rc=$?"
  grep -E "tokens/s|TFLOP|MFU|peak alloc|step time|host" "$L/llama8b_ab_$precision.txt"
done; pack
fi
rm -rf "$work"
