#!/usr/bin/env bash
# The training-quality checks (docs/CORRECTNESS.md, "Loss curves"), on one GPU, from the
# bundle of scripts/gpu_bundle.sh and a python3 with PyTorch and numpy, from the repository
# root. Every run trains GPT-2-style models on the shipped Austen text, tokenized to llm.c
# shards by `tokenize --val-fraction 0.05`, for 300 steps of 16 x 1024 tokens (AdamW lr 6e-4,
# betas 0.9/0.95, 30 warm-up steps, cosine to 0, weight decay 0.1, clip 1.0; validation on
# the first 3 batches of the validation file every 50 steps). Parts, chosen by PARTS:
#
#   golden  the golden curves of tests/train/golden: fsdp.cpp's initial weights and batches
#           of the two tiny recipes, replayed by PyTorch in f64 on the CPU (LOG_DIR/golden/),
#           with AdamW and with Muon (optimizer.optimizer=muon: *_muon_curve.json)
#   muon    Muon against PyTorch's Muon (torch.optim's update, q/k/v and gate/up split as
#           fsdp.cpp splits them), GPT-2 d12 and the Llama: fsdp.cpp with 3 seeds, PyTorch
#           with 3 of its own (curve.py independent), one replay from the same weights and
#           batches; the table of validation losses (MUON_MODELS="gpt2 llama" by default;
#           MUON_SEEDS="1 2 3" by default; MUON_VARIANTS adds seed-1 runs with other keys;
#           MUON_REPLAY= skips the replay)
#   seeds   GPT-2 d12 with the recipe's defaults: fsdp.cpp with 3 seeds on the llm.c shards
#           and 3 on the text itself (dataset.type=text), PyTorch with 3 seeds of its own
#           initialization and sampler (curve.py independent)
#   gpt2    GPT-2 d12, same weights and batches (curve.py replay): bf16, then bf16 with each
#           of fsdp.cpp's options that change the arithmetic (whole-batch classifier, f32
#           residual stream, full recompute)
#   f32     the same in f32 on both sides (TF32 off)
#   bf16    the gpt2 part's first replay only (the defaults): the quick check after a change
#   llama   a Llama of the same size (12 x 768, 12 heads sharing 4 kv heads, untied), same
#           weights and batches, in bf16 (LLAMA_PRECISIONS="bf16 f32" adds f32)
#   rope32  the llama part's bf16 run replayed twice: by the twin as it is (Hugging Face's
#           rotary embedding in bf16) and with its rotary embedding in f32 rounded once, as
#           fsdp.cpp computes it (curve.py replay --rotary-f32): how much of the bf16 gap
#           between the two is the rotation's rounding
#   noise   the noise floor of an f32 comparison: fsdp.cpp's f32 GPT-2 and Llama runs again
#           with micro-batches of 8 (two per step), a change of rounding only; compare their
#           metrics with the f32 runs' (curve.py table); the GPT-2 one is also replayed by the
#           twin, whose curve against the micro-batch-16 replay's is PyTorch's own floor
#   mb8     the Llama f32 comparison again with micro-batches of 8 on both sides (the noise
#           part replays GPT-2's)
#   fp8     FP8 against bf16 (mixed_precision.fp8, docs/CORRECTNESS.md "FP8"): GPT-2 d12 in
#           bf16, hybrid, e4m3 and hybrid with delayed scaling, the Llama in bf16 and hybrid,
#           and the ~1B Llama of configs/llama-1b.json in bf16, hybrid and hybrid delayed,
#           each from the same weights and batches; the table of their validation losses
#   fp8all  the same with FP8 in every block (first_last_layers_bf16=false): GPT-2 d12 with
#           tensorwise, delayed and blockwise scaling, and the ~1B Llama with the same three
#   fp8cls  the classifier in FP8 too (mixed_precision.fp8_classifier, delayed scaling, the
#           first and last blocks in bf16): GPT-2 d12 and the ~1B Llama in bf16, FP8 blocks
#           (delayed) and FP8 blocks and classifier, each from the same weights and batches
#           (bf16 runs of the fp8 part reused when it ran in this call)
#   rowwise GPT-2 d12 and the ~1B Llama with row scaling (fp8_recipe=rowwise, hybrid, the
#           first and last blocks in bf16) against their bf16 runs (those of the fp8 part
#           when it ran in this call); ROWWISE_MODELS="gpt2 llama1b" (default) picks the models
#
#   PARTS="golden seeds gpt2 f32 llama" scripts/curves.sh [BUNDLE_DIR] [LOG_DIR]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" "${1:-.device}"
L="${2:-${OUT:-/tmp}/curves}"
mkdir -p "$L"
B="$bundle"
work="$(mktemp -d)"
PARTS="${PARTS:-golden seeds gpt2 f32 llama}"
want() { [[ " $PARTS " == *" $1 "* ]]; }
trap 'pkill -TERM -P $$; exit 143' TERM INT  # runs started with `waited` (gpu_env.sh) stop too
say() { echo "== $* ($(date +%T))"; }
curve() { python3 tools/parity/curve.py "$@"; }

"$B/tools/tokenize" --val-fraction 0.05 --out "$work/austen" third_party/text/austen.txt > "$L/tokenize.log"
GPT2=(--config configs/gpt2-124m.json
  dataset.train_path="$work/austen_train_*.bin" dataset.val_path="$work/austen_val_*.bin"
  train.train_iters=300 train.micro_batch_size=16 train.global_batch_size=16
  train.eval_interval=50 train.eval_iters=3 scheduler.lr_warmup_iters=30
  scheduler.lr_decay_iters=300 optimizer.min_lr=0 ddp.data_parallel_sharding_strategy=no_shard
  checkpoint.save=null checkpoint.load=null logger.log_interval=1)
LLAMA=(model.family=llama model.n_kv_head=4 model.d_ff=2048 model.tie_embeddings=false
  model.rope_theta=10000)
REPLAY=(logger.samples_file=samples.jsonl logger.log_update_norms=true)

# train NAME ARGS...: one fsdp.cpp run into $L/NAME (its step lines in $L/NAME.log).
train() {
  local name=$1; shift
  waited timeout 580 "$B/tools/train" "$@" run.output_dir="$L/$name" > "$L/$name.log" 2>&1
  say "fsdp.cpp $name rc=$? $(grep -E '^step 300/' "$L/$name.log" | cut -c1-80)"
}

# replay NAME PRECISION ARGS...: fsdp.cpp trains with ARGS, then its PyTorch twin from the
# same initial weights on the same batches.
replay() {
  local name=$1 precision=$2; shift 2
  train "$name" "$@" "${REPLAY[@]}" mixed_precision.compute_dtype="$precision"
  "$B/tools/convert" init "$L/$name/init.safetensors" "$@" > /dev/null
  twin "$name" curve.json
}

# twin NAME OUT [CURVE_ARGS...]: the PyTorch twin's replay of run NAME into $L/NAME/OUT.
twin() {
  local name=$1 out=$2; shift 2
  waited timeout 580 python3 tools/parity/curve.py replay "$L/$name" --weights "$L/$name/init.safetensors" \
    --out "$L/$name/$out" --svg "$L/$name/${out%.json}.svg" "$@" > "$L/$name/${out%.json}.log" 2>&1
  say "replay $name $* rc=$?"; tail -1 "$L/$name/${out%.json}.log"
}

if want golden; then
  mkdir -p "$L/golden"
  python3 - "$work/austen_bytes.bin" <<'PY'
import sys, numpy as np
tokens = np.frombuffer(open("third_party/text/austen.txt", "rb").read(), np.uint8).astype(np.uint16)
header = np.zeros(256, np.int32); header[:3] = (20240520, 1, len(tokens))
open(sys.argv[1], "wb").write(header.tobytes() + tokens.tobytes())
PY
  for run in ${GOLDEN_RUNS:-gpt2_tiny llama_tiny gpt2_tiny_muon llama_tiny_muon}; do
    m=${run%_muon}; opt=(); [ "$run" != "$m" ] && opt=(optimizer.optimizer=muon)
    R=(--config tests/train/golden/$m.json dataset.train_path="$work/austen_bytes.bin" "${opt[@]}")
    waited timeout 120 "$B/tools/train" "${R[@]}" run.output_dir="$L/golden/$run" > "$L/golden/$run.log" 2>&1
    "$B/tools/convert" init "$L/golden/$run/init.safetensors" "${R[@]}" > /dev/null
    CUDA_VISIBLE_DEVICES= waited timeout 300 python3 tools/parity/curve.py replay "$L/golden/$run" \
      --weights "$L/golden/$run/init.safetensors" --device cpu --out "$L/golden/$run/curve.json" \
      --golden "$L/golden/${run}_curve.json" > "$L/golden/$run.replay.log" 2>&1
    say "golden $run rc=$?"; tail -1 "$L/golden/$run.replay.log"
  done
fi

if want seeds; then
  for s in 1 2 3; do
    train "seed$s" "${GPT2[@]}" run.seed=$s dataset.seed=$s
    train "text_seed$s" "${GPT2[@]}" run.seed=$s dataset.seed=$s dataset.type=text \
      dataset.train_path=third_party/text/austen.txt dataset.val_path=null dataset.val_fraction=0.05
    waited timeout 580 python3 tools/parity/curve.py independent "$L/seed$s" --seed $s --precision bf16 \
      --out "$L/torch_seed$s.json" > "$L/torch_seed$s.log" 2>&1
    say "pytorch seed $s rc=$?"
  done
  curve table --steps 50,100,200,300 fsdp.cpp="$L/seed1" fsdp.cpp="$L/seed2" fsdp.cpp="$L/seed3" \
    text="$L/text_seed1" text="$L/text_seed2" text="$L/text_seed3" \
    pytorch="$L/torch_seed1.json" pytorch="$L/torch_seed2.json" pytorch="$L/torch_seed3.json" \
    | tee "$L/seeds_table.txt"
fi

if want muon; then
  for model in ${MUON_MODELS:-gpt2 llama}; do
    extra=(optimizer.optimizer=muon); [ "$model" = llama ] && extra+=("${LLAMA[@]}")
    table=()
    for s in ${MUON_SEEDS:-1 2 3}; do
      train "muon_${model}_seed$s" "${GPT2[@]}" "${extra[@]}" run.seed=$s dataset.seed=$s
      waited timeout 580 python3 tools/parity/curve.py independent "$L/muon_${model}_seed$s" --seed $s \
        --precision bf16 --out "$L/muon_${model}_torch$s.json" > "$L/muon_${model}_torch$s.log" 2>&1
      say "pytorch muon $model seed $s rc=$?"; tail -1 "$L/muon_${model}_torch$s.log"
      table+=(fsdp.cpp="$L/muon_${model}_seed$s" pytorch="$L/muon_${model}_torch$s.json")
    done
    # MUON_VARIANTS="NAME=KEY=VALUE[,KEY=VALUE...] ...": seed-1 runs with other settings.
    for v in ${MUON_VARIANTS:-}; do
      train "muon_${model}_${v%%=*}" "${GPT2[@]}" "${extra[@]}" ${v#*=} run.seed=1 dataset.seed=1
      table+=("${v%%=*}=$L/muon_${model}_${v%%=*}")
    done
    curve table --steps 50,100,150,200,300 "${table[@]}" | tee "$L/muon_${model}_table.txt"
    [ -n "${MUON_REPLAY-1}" ] && replay "muon_${model}_bf16" bf16 "${GPT2[@]}" "${extra[@]}"
  done
fi

if want gpt2; then
  replay gpt2_bf16 bf16 "${GPT2[@]}"
  replay gpt2_bf16_whole_classifier bf16 "${GPT2[@]}" model.classifier_chunk_rows=0
  replay gpt2_bf16_fp32_residual bf16 "${GPT2[@]}" model.fp32_residual_connection=true
  replay gpt2_bf16_full_recompute bf16 "${GPT2[@]}" model.activation_recompute=full
fi
want bf16 && replay gpt2_bf16 bf16 "${GPT2[@]}"
want f32 && replay gpt2_f32 f32 "${GPT2[@]}"
if want llama; then
  for p in ${LLAMA_PRECISIONS:-bf16}; do replay llama_$p $p "${GPT2[@]}" "${LLAMA[@]}"; done
fi

if want rope32; then
  replay llama_bf16_rope32 bf16 "${GPT2[@]}" "${LLAMA[@]}"
  twin llama_bf16_rope32 curve_rotary_f32.json --rotary-f32
fi

want mb8 && replay llama_f32_mb8_replay f32 "${GPT2[@]}" "${LLAMA[@]}" train.micro_batch_size=8

if want noise; then
  # GPT-2 replayed too: the twin's curve against its micro-batch-16 replay is PyTorch's floor.
  replay gpt2_f32_mb8 f32 "${GPT2[@]}" train.micro_batch_size=8
  train llama_f32_mb8 "${GPT2[@]}" "${LLAMA[@]}" mixed_precision.compute_dtype=f32 train.micro_batch_size=8
fi

# The ~1B Llama of configs/llama-1b.json (16 x 2048, 8 kv heads) on the same tokens and
# schedule, at sequences of 1024.
L1B=(--config configs/llama-1b.json dataset.type=llmc model.seq_length=1024 "${GPT2[@]:2}")

if want fp8; then
  train gpt2_bf16_ref "${GPT2[@]}"
  for f in hybrid e4m3; do train gpt2_fp8_$f "${GPT2[@]}" mixed_precision.fp8=$f; done
  train gpt2_fp8_delayed "${GPT2[@]}" mixed_precision.fp8=hybrid mixed_precision.fp8_recipe=delayed
  train llama_bf16_ref "${GPT2[@]}" "${LLAMA[@]}"
  train llama_fp8_hybrid "${GPT2[@]}" "${LLAMA[@]}" mixed_precision.fp8=hybrid
  train llama1b_bf16_ref "${L1B[@]}"
  train llama1b_fp8_hybrid "${L1B[@]}" mixed_precision.fp8=hybrid
  train llama1b_fp8_delayed "${L1B[@]}" mixed_precision.fp8=hybrid mixed_precision.fp8_recipe=delayed
  curve table --steps 50,100,150,200,250,300 gpt2_bf16="$L/gpt2_bf16_ref" \
    gpt2_fp8_hybrid="$L/gpt2_fp8_hybrid" gpt2_fp8_e4m3="$L/gpt2_fp8_e4m3" \
    gpt2_fp8_delayed="$L/gpt2_fp8_delayed" \
    llama_bf16="$L/llama_bf16_ref" llama_fp8_hybrid="$L/llama_fp8_hybrid" \
    llama1b_bf16="$L/llama1b_bf16_ref" llama1b_fp8_hybrid="$L/llama1b_fp8_hybrid" \
    llama1b_fp8_delayed="$L/llama1b_fp8_delayed" | tee "$L/fp8_table.txt"
fi

if want fp8all; then
  # FP8 in every block (mixed_precision.first_last_layers_bf16=false; the classifier stays
  # bf16), against the bf16 runs of the fp8 part when it ran in this call.
  ALL=(mixed_precision.fp8=hybrid mixed_precision.first_last_layers_bf16=false)
  [ -d "$L/gpt2_bf16_ref" ] || train gpt2_bf16_ref "${GPT2[@]}"
  for r in tensorwise delayed blockwise; do
    train gpt2_fp8all_$r "${GPT2[@]}" "${ALL[@]}" mixed_precision.fp8_recipe=$r
  done
  [ -d "$L/llama1b_bf16_ref" ] || train llama1b_bf16_ref "${L1B[@]}"
  for r in tensorwise delayed blockwise; do
    train llama1b_fp8all_$r "${L1B[@]}" "${ALL[@]}" mixed_precision.fp8_recipe=$r
  done
  curve table --steps 50,100,150,200,250,300 gpt2_bf16="$L/gpt2_bf16_ref" \
    gpt2_fp8all_tensorwise="$L/gpt2_fp8all_tensorwise" gpt2_fp8all_delayed="$L/gpt2_fp8all_delayed" \
    gpt2_fp8all_blockwise="$L/gpt2_fp8all_blockwise" llama1b_bf16="$L/llama1b_bf16_ref" \
    llama1b_fp8all_tensorwise="$L/llama1b_fp8all_tensorwise" \
    llama1b_fp8all_delayed="$L/llama1b_fp8all_delayed" \
    llama1b_fp8all_blockwise="$L/llama1b_fp8all_blockwise" | tee "$L/fp8all_table.txt"
fi

if want fp8cls; then
  DL=(mixed_precision.fp8=hybrid mixed_precision.fp8_recipe=delayed)
  [ -d "$L/gpt2_bf16_ref" ] || train gpt2_bf16_ref "${GPT2[@]}"
  [ -d "$L/gpt2_fp8_delayed" ] || train gpt2_fp8_delayed "${GPT2[@]}" "${DL[@]}"
  train gpt2_fp8cls_delayed "${GPT2[@]}" "${DL[@]}" mixed_precision.fp8_classifier=true
  [ -d "$L/llama1b_bf16_ref" ] || train llama1b_bf16_ref "${L1B[@]}"
  [ -d "$L/llama1b_fp8_delayed" ] || train llama1b_fp8_delayed "${L1B[@]}" "${DL[@]}"
  train llama1b_fp8cls_delayed "${L1B[@]}" "${DL[@]}" mixed_precision.fp8_classifier=true
  curve table --steps 50,100,150,200,250,300 gpt2_bf16="$L/gpt2_bf16_ref" \
    gpt2_fp8_delayed="$L/gpt2_fp8_delayed" gpt2_fp8cls_delayed="$L/gpt2_fp8cls_delayed" \
    llama1b_bf16="$L/llama1b_bf16_ref" llama1b_fp8_delayed="$L/llama1b_fp8_delayed" \
    llama1b_fp8cls_delayed="$L/llama1b_fp8cls_delayed" | tee "$L/fp8cls_table.txt"
fi

if want rowwise; then
  RW=(mixed_precision.fp8=hybrid mixed_precision.fp8_recipe=rowwise)
  rows=()
  if [[ " ${ROWWISE_MODELS:-gpt2 llama1b} " == *" gpt2 "* ]]; then
    [ -d "$L/gpt2_bf16_ref" ] || train gpt2_bf16_ref "${GPT2[@]}"
    train gpt2_fp8_rowwise "${GPT2[@]}" "${RW[@]}"
    rows+=(gpt2_bf16="$L/gpt2_bf16_ref" gpt2_fp8_rowwise="$L/gpt2_fp8_rowwise")
  fi
  if [[ " ${ROWWISE_MODELS:-gpt2 llama1b} " == *" llama1b "* ]]; then
    [ -d "$L/llama1b_bf16_ref" ] || train llama1b_bf16_ref "${L1B[@]}"
    train llama1b_fp8_rowwise "${L1B[@]}" "${RW[@]}"
    rows+=(llama1b_bf16="$L/llama1b_bf16_ref" llama1b_fp8_rowwise="$L/llama1b_fp8_rowwise")
  fi
  curve table --steps 50,100,150,200,250,300 "${rows[@]}" | tee "$L/rowwise_table.txt"
fi

# One line per replay: the validation-loss differences (fsdp.cpp - PyTorch).
for f in "$L"/*/curve.json "$L"/*/curve_*.json; do
  [ -f "$f" ] || continue
  python3 - "$f" <<'PY'
import json, os, sys
c = json.load(open(sys.argv[1])); s = c["summary"]
run, name = sys.argv[1].split('/')[-2], os.path.basename(sys.argv[1])[len("curve"):-len(".json")]
print(f"{run + name:<32} {c['precision']:>5}  val diff "
      + " ".join(f"@{k} {v:+.4f}" for k, v in s["val_loss_diff"].items())
      + f"  |train diff| max {s['max_abs_loss_diff']:.3f}, mean last 50 {s['mean_loss_diff_last_50']:+.4f}")
PY
done | tee "$L/replay_table.txt"
rm -rf "$work"
# Everything but the weights and sample lists, in one file beside LOG_DIR.
tar czf "$L.tgz" --exclude=init.safetensors --exclude=samples.jsonl -C "$(dirname "$L")" "$(basename "$L")"
