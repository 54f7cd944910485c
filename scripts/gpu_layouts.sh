#!/usr/bin/env bash
# Every multi-rank layout trained on ONE GPU: the ranks share the device through the staged
# backend (dist.backend=staged), and each layout's curve is compared with the same recipe on
# one rank, 50 steps each (the global batch is 8 sequences of 64 tokens everywhere; micro-
# batches of 2, so 4, 2 or 1 per rank):
#   GPT-2 and Llama tiny (4 layers, d 128): TP2; TP2 + SP (vocabulary-parallel head) at
#   ZeRO-3; CP2 ring at ZeRO-1; CP2 all-gather at ZeRO-2; TP2 x ZeRO-3 x DP2 (np 4); HSDP
#   2 x 2 at ZeRO-3 (np 4), in f32 and in bf16; EP2 on configs/moe-tiny.json at ZeRO-3 (f32
#   and bf16); FP8 (hybrid) with fp8_param at ZeRO-3 on np 2 against FP8 on one rank;
#   a TP2 checkpoint saved at step 25 resumed on one rank, and a one-rank one resumed on TP2;
#   Muon (optimizer.optimizer=muon, Llama tiny, f32) at ZeRO-3 on np 2 and TP2 x ZeRO-3 x DP2
#   on np 4 against Muon on one rank.
# Bars: f32, every step's loss within 1e-5 relative of the one-rank run; bf16 (and FP8), the
# validation loss at step 50 within 0.02; the resumed runs, f32, every step as the one-rank
# run's. MoE in f32: every step within 1e-5 while both runs route every token alike (the
# tokens per expert of every layer, logger.log_expert_tokens, are equal), at least 10 steps,
# and the validation loss at step 50 within 0.02. Why: top-k routing is discontinuous. Muon,
# the validation loss at step 50 within 0.02: its Newton-Schulz iteration rounds the momentum
# to bf16 on the GPU, so last-bit differences of the gradients (reduction order) flip roundings
# (CPU ranks in f64 agree to 1e-12: tests/train/muon_layouts_test.cc). EP2
# sums each expert's weight gradient over both ranks' rows in one product where one rank sums
# micro-batch by micro-batch, so the weights differ in the last bits; once a token's two
# best scores are that close, it goes to another expert and from then on the two runs train
# different networks. In f64 on CPU ranks the same layouts agree to 1e-12 over every step
# (tests/train/moe_train_test.cc), which is where this layout is proven exact. Writes LOG_DIR/layouts.md (docs/CORRECTNESS.md's table) and ends with the line
# "N passed, N failed". From the repository root of a GPU machine, with the bundle of
# scripts/gpu_bundle.sh:
#
#   scripts/gpu_layouts.sh [BUNDLE_DIR] [LOG_DIR]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
L="${2:-${OUT:-/tmp}/gpu-layouts}"
mkdir -p "$L"
T="$bundle/tools/train"
# report [stopped]: the table of every layout against its one-rank run (LOG_DIR/layouts.md),
# ending with "N passed, N failed". Also run when the script is stopped ("stopped"), so a call
# cut short still reports the layouts that finished; only then does a run without its step
# 50 (cut short, or never started) count as not run instead of failed.
report() {
python3 - "$L" "${1:-}" <<'PY'
import json, os, sys
d, stopped = sys.argv[1], sys.argv[2] == "stopped"

def curve(name):
    path = os.path.join(d, name, "metrics.jsonl")
    loss, val, tokens = {}, None, {}
    if not os.path.exists(path):
        return loss, val, tokens
    for line in open(path):
        r = json.loads(line)
        if "loss" in r: loss[r["step"]] = r["loss"]
        if "moe_expert_tokens" in r: tokens[r["step"]] = r["moe_expert_tokens"]
        if "val_loss" in r and r["step"] == 50: val = r["val_loss"]
    return loss, val, tokens

rows, passed, failed, unrun = [], 0, 0, 0
def check(name, base, kind, ranks, first=1):
    global passed, failed, unrun
    got, gval, gtok = curve(name)
    want, wval, wtok = curve(base)
    if stopped and not (50 in got and 50 in want):
        unrun += 1
        rows.append(f"| {name} | {ranks} | {base} | not run to step 50 (the call stopped) | - |")
        return
    steps = range(first, 51)
    if kind == "moe_f32":  # see the header: step by step while routed alike, then val@50
        alike = next((s for s in steps if s not in gtok or gtok.get(s) != wtok.get(s)), 51)
        prefix = range(first, alike)
        worst = max((abs(got[s] - want[s]) / abs(want[s]) for s in prefix if s in got and s in want),
                    default=float("nan"))
        have = gval is not None and wval is not None
        diff = gval - wval if have else float("nan")
        ok = (alike > 10 and all(s in got and s in want for s in prefix) and worst <= 1e-5
              and have and abs(diff) <= 0.02)
        measure = (f"max rel. loss diff {worst:.1e} (steps {first}-{alike - 1}, routed alike); "
                   f"val@50 {gval} vs {wval} ({diff:+.4f})")
    elif kind == "f32":
        ok = all(s in got and s in want for s in steps)
        worst = max((abs(got[s] - want[s]) / abs(want[s]) for s in steps if s in got and s in want),
                    default=float("nan"))
        ok = ok and worst <= 1e-5
        measure = f"max rel. loss diff {worst:.1e} (steps {first}-50)"
    else:  # bf16, FP8 and Muon ("val50"): the validation loss at step 50
        have = gval is not None and wval is not None
        diff = gval - wval if have else float("nan")
        ok = have and abs(diff) <= 0.02
        measure = f"val@50 {gval} vs {wval} ({diff:+.4f})"
    passed += ok; failed += not ok
    rows.append(f"| {name} | {ranks} | {base} | {measure} | {'pass' if ok else 'FAIL'} |")

layouts = [("tp2", 2), ("tp2_sp_z3", 2), ("cp2_ring_z1", 2), ("cp2_allgather_z2", 2),
           ("tp2_z3_dp2", 4), ("hsdp_2x2", 4)]
for m in ("gpt2", "llama"):
    for p in ("f32", "bf16"):
        for l, n in layouts:
            check(f"{m}_{p}_{l}", f"{m}_{p}_1rank", p, n)
check("moe_f32_ep2_z3", "moe_f32_1rank", "moe_f32", 2)
check("moe_bf16_ep2_z3", "moe_bf16_1rank", "bf16", 2)
check("gpt2_fp8_param_z3_np2", "gpt2_fp8_1rank", "bf16", 2)
check("llama_muon_z3_np2", "llama_muon_1rank", "val50", 2)
check("llama_muon_tp2_z3_dp2", "llama_muon_1rank", "val50", 4)
check("ck_tp2_to_1rank", "gpt2_f32_1rank", "f32", 1, first=26)
check("ck_1rank_to_tp2", "gpt2_f32_1rank", "f32", 2, first=26)
table = ["| run | ranks on the GPU | against | measured | result |", "|---|---|---|---|---|"] + rows
open(os.path.join(d, "layouts.md"), "w").write("\n".join(table) + "\n")
print("\n".join(table))
if unrun: print(f"{unrun} layouts did not run to step 50 (the call stopped first)")
print(f"{passed} passed, {failed} failed")
PY
}
trap 'pkill -TERM -P $$; wait; report stopped; exit 143' TERM INT
say() { echo "== $* ($(date +%T))"; }

common=(train.train_iters=50 train.eval_interval=50 train.eval_iters=4 logger.log_interval=1
        dist.distributed_timeout_minutes=1
        train.micro_batch_size=2 train.global_batch_size=8 checkpoint.save=null
        checkpoint.load=null)
GPT=(--config configs/tiny.json)
LLAMA=(--config configs/tiny.json model.family=llama model.n_kv_head=2 model.d_ff=384
       model.tie_embeddings=false)
MOE=(--config configs/moe-tiny.json logger.log_expert_tokens=true)
F32=(mixed_precision.compute_dtype=f32)
BF16=(mixed_precision.compute_dtype=bf16)
FP8=(mixed_precision.compute_dtype=bf16 mixed_precision.fp8=hybrid)

run() {  # name ranks args...: one training run, logged to $L/name.log, metrics in $L/name/
  local name="$1" n="$2"; shift 2
  local launch=("$T")
  [ "$n" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$n" "$T")
  waited timeout 300 "${launch[@]}" "$@" "${common[@]}" run.output_dir="$L/$name" \
    > "$L/$name.log" 2>&1
  say "$name (np $n) rc=$?"
}

layouts() {  # model-name precision model-args...: the one-rank run and every dense layout
  local m="$1" p="$2"; shift 2
  local prec=("${F32[@]}")
  [ "$p" = bf16 ] && prec=("${BF16[@]}")
  run "${m}_${p}_1rank" 1 "$@" "${prec[@]}"
  run "${m}_${p}_tp2" 2 "$@" "${prec[@]}" dist.backend=staged model.tensor_model_parallel_size=2
  run "${m}_${p}_tp2_sp_z3" 2 "$@" "${prec[@]}" dist.backend=staged \
    model.tensor_model_parallel_size=2 model.sequence_parallel=true \
    ddp.data_parallel_sharding_strategy=optim_grads_params
  run "${m}_${p}_cp2_ring_z1" 2 "$@" "${prec[@]}" dist.backend=staged \
    model.context_parallel_size=2 model.cp_comm_type=p2p ddp.data_parallel_sharding_strategy=optim
  run "${m}_${p}_cp2_allgather_z2" 2 "$@" "${prec[@]}" dist.backend=staged \
    model.context_parallel_size=2 model.cp_comm_type=all_gather \
    ddp.data_parallel_sharding_strategy=optim_grads
  run "${m}_${p}_tp2_z3_dp2" 4 "$@" "${prec[@]}" dist.backend=staged \
    model.tensor_model_parallel_size=2 ddp.data_parallel_sharding_strategy=optim_grads_params
  run "${m}_${p}_hsdp_2x2" 4 "$@" "${prec[@]}" dist.backend=staged dist.dp_outer=2 \
    ddp.data_parallel_sharding_strategy=optim_grads_params
}

moe() {  # precision
  local p="$1" prec=("${F32[@]}")
  [ "$p" = bf16 ] && prec=("${BF16[@]}")
  run "moe_${p}_1rank" 1 "${MOE[@]}" "${prec[@]}"
  run "moe_${p}_ep2_z3" 2 "${MOE[@]}" "${prec[@]}" dist.backend=staged \
    model.expert_model_parallel_size=2 ddp.data_parallel_sharding_strategy=optim_grads_params
}

# The f32 runs first (every layout of each kind at least once, checked step by step), then
# checkpoints and FP8, then bf16: a call cut short keeps the widest coverage.
layouts gpt2 f32 "${GPT[@]}"
layouts llama f32 "${LLAMA[@]}"
moe f32
# Checkpoints across layouts (f32): saved at step 25 by TP2, resumed on one rank; saved by
# one rank, resumed on TP2. Both must continue on the one-rank curve (gpt2_f32_1rank).
run ck_tp2_save 2 "${GPT[@]}" "${F32[@]}" dist.backend=staged model.tensor_model_parallel_size=2 \
  train.train_iters=25 checkpoint.save="$L/ck_tp2" checkpoint.save_interval=0
run ck_tp2_to_1rank 1 "${GPT[@]}" "${F32[@]}" checkpoint.load="$L/ck_tp2"
run ck_1rank_save 1 "${GPT[@]}" "${F32[@]}" train.train_iters=25 checkpoint.save="$L/ck_1rank" \
  checkpoint.save_interval=0
run ck_1rank_to_tp2 2 "${GPT[@]}" "${F32[@]}" dist.backend=staged \
  model.tensor_model_parallel_size=2 checkpoint.load="$L/ck_1rank"
run gpt2_fp8_1rank 1 "${GPT[@]}" "${FP8[@]}"
run gpt2_fp8_param_z3_np2 2 "${GPT[@]}" "${FP8[@]}" dist.backend=staged \
  mixed_precision.fp8_param=true ddp.data_parallel_sharding_strategy=optim_grads_params
MUON=("${LLAMA[@]}" "${F32[@]}" optimizer.optimizer=muon)
run llama_muon_1rank 1 "${MUON[@]}"
run llama_muon_z3_np2 2 "${MUON[@]}" dist.backend=staged \
  ddp.data_parallel_sharding_strategy=optim_grads_params
run llama_muon_tp2_z3_dp2 4 "${MUON[@]}" dist.backend=staged model.tensor_model_parallel_size=2 \
  ddp.data_parallel_sharding_strategy=optim_grads_params
layouts gpt2 bf16 "${GPT[@]}"
layouts llama bf16 "${LLAMA[@]}"
moe bf16
report
