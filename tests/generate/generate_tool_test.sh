#!/usr/bin/env bash
# tools/generate on what training writes: a ZeRO-3 checkpoint saved by 2 ranks and its
# Hugging Face export give the same sampled tokens, with and without the key/value cache;
# greedy decoding is the same with and without the cache; bad arguments and paths, and a
# checkpoint with a flipped byte, are refused with a message.
# Usage: generate_tool_test.sh TRAIN CONVERT GENERATE
set -u
train="$1" convert="$2" generate="$3"
source tests/sh_test_support.sh generate

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "---- $f"; tail -n 20 "$f"; done
  exit 1
}

mpirun --oversubscribe -np 2 "$train" --config configs/tiny.json model.n_layer=2 \
  train.train_iters=2 train.micro_batch_size=4 train.global_batch_size=8 \
  ddp.data_parallel_sharding_strategy=optim_grads_params checkpoint.save="$work/ckpt" \
  run.output_dir="$work/run" > "$work/train.log" 2>&1 || fail "training exited with status $?"
"$convert" export "$work/ckpt" "$work/hf" --no-check-batch > "$work/export.log" 2>&1 \
  || fail "export exited with status $?"

# gen NAME MODEL ARGS...: one run; its ids are then in $work/NAME.ids.
gen() {
  local name="$1" model="$2"
  shift 2
  "$generate" "$model" --prompt "It is a truth" --max-new-tokens 24 --print-ids "$@" \
    > "$work/$name.log" 2>&1 || fail "$name exited with status $?"
  sed -n 's/^ids: //p' "$work/$name.log" > "$work/$name.ids"
}
same() { cmp -s "$work/$1.ids" "$work/$2.ids"; }

sampled=(--temperature 1 --top-k 50 --top-p 0.95 --seed 7)
gen native "$work/ckpt" "${sampled[@]}"
[ "$(wc -w < "$work/native.ids")" -eq 24 ] || fail "expected 24 ids"
gen native_nocache "$work/ckpt" "${sampled[@]}" --no-kv-cache
same native native_nocache || fail "the cache changed the sampled tokens"
gen hf "$work/hf" "${sampled[@]}"
same native hf || fail "the Hugging Face export samples other tokens than the checkpoint"
gen other_seed "$work/ckpt" --temperature 1 --seed 8
same native other_seed && fail "another seed sampled the same tokens"
gen greedy "$work/ckpt/step_000002" --temperature 0
gen greedy_nocache "$work/ckpt" --temperature 0 --no-kv-cache
same greedy greedy_nocache || fail "greedy decoding differs with the cache"
grep -q "^It is a truth" "$work/native.log" || fail "the prompt is not printed first"

"$generate" "$work/nowhere" > "$work/missing.log" 2>&1
[ $? -eq 1 ] || fail "a missing model: expected exit status 1"
grep -q "nowhere" "$work/missing.log" || fail "the error does not name the path"
"$generate" "$work/ckpt" --top-p 2 > "$work/bad_flag.log" 2>&1
[ $? -eq 2 ] || fail "--top-p 2: expected exit status 2"
# --top-k past the model's vocabulary (GPT-2's 50257 tokens).
"$generate" "$work/ckpt" --top-k 50258 > "$work/top_k.log" 2>&1
[ $? -eq 2 ] || fail "--top-k 50258: expected exit status 2"
grep -q -- "--top-k 50258 is more than the model's vocabulary of 50257" "$work/top_k.log" \
  || fail "the --top-k error does not name the vocabulary"

# A byte flipped in the middle of a shard file (tensor data): refused, as train and export
# refuse it, naming the file.
cp -r "$work/ckpt/step_000002" "$work/damaged"
shard="$work/damaged/shard_00000_of_00002.safetensors"
[ -f "$shard" ] || fail "no $shard"
offset=$(( $(stat -c %s "$shard") / 2 ))
byte=$(od -An -tu1 -j "$offset" -N1 "$shard" | tr -d ' ')
printf "$(printf '\\%03o' $(( byte ^ 16 )))" |
  dd of="$shard" bs=1 seek="$offset" count=1 conv=notrunc 2> /dev/null
"$generate" "$work/damaged" --max-new-tokens 2 > "$work/damaged.log" 2>&1
[ $? -eq 1 ] || fail "a damaged checkpoint: expected exit status 1"
grep -q "shard_00000_of_00002.safetensors: checksum mismatch" "$work/damaged.log" \
  || fail "the error does not name the damaged file"
echo "PASS (native = export = no cache: $(cat "$work/native.ids"))"
