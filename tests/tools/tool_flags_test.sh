#!/usr/bin/env bash
# Every numeric flag of the tools is read whole, finite and within its stated bounds: a bad
# value is refused before any work, with exit status 2 (bench: 1) and a message naming the
# flag. Nothing here needs a model or data: the flags are checked first.
# Usage: tool_flags_test.sh GENERATE CONVERT TOKENIZE BENCH PARITY_DUMP
set -u
generate="$1" convert="$2" tokenize="$3" bench="$4" parity_dump="$5"
source tests/sh_test_support.sh tool_flags

n=0
# refused STATUS FLAG COMMAND...: COMMAND exits with STATUS and its message names FLAG.
refused() {
  local status="$1" flag="$2"
  shift 2
  n=$((n + 1))
  "$@" > "$work/$n.log" 2>&1
  local got=$?
  [ "$got" -eq "$status" ] || fail "$* exited with status $got, expected $status"
  grep -q -- "$flag" "$work/$n.log" || fail "$*: the message does not name $flag"
  rm -f "$work/$n.log"
}

model="$work/no_model"  # never reached
refused 2 --max-new-tokens "$generate" "$model" --max-new-tokens 1e12
refused 2 --max-new-tokens "$generate" "$model" --max-new-tokens 1048577
refused 2 --max-new-tokens "$generate" "$model" --max-new-tokens 64abc
refused 2 --max-new-tokens "$generate" "$model" --max-new-tokens -1
refused 2 --temperature "$generate" "$model" --temperature inf
refused 2 --temperature "$generate" "$model" --temperature nan
refused 2 --temperature "$generate" "$model" --temperature 0.8x
refused 2 --temperature "$generate" "$model" --temperature -1
refused 2 --top-k "$generate" "$model" --top-k 2.5
refused 2 --top-p "$generate" "$model" --top-p 0
refused 2 --top-p "$generate" "$model" --top-p nan
refused 2 --seed "$generate" "$model" --seed -1
refused 2 --seed "$generate" "$model" --seed 18446744073709551616
refused 2 --seed "$generate" "$model" --seed=1e3

refused 2 --padded-vocab "$convert" import "$work/hf" "$work/out" --padded-vocab 50304abc
refused 2 --padded-vocab "$convert" import "$work/hf" "$work/out" --padded-vocab -128
refused 2 --padded-vocab "$convert" import "$work/hf" "$work/out" --padded-vocab 1e9

refused 2 --shard-tokens "$tokenize" --out "$work/t" --shard-tokens 1e3 "$work/in.txt"
refused 2 --workers "$tokenize" --out "$work/t" --workers 2x "$work/in.txt"
refused 2 --val-fraction "$tokenize" --out "$work/t" --val-fraction nan "$work/in.txt"

refused 1 --steps "$bench" train --config configs/tiny.json --steps 10abc
refused 1 --warmup "$bench" train --config configs/tiny.json --warmup -2
refused 1 --m "$bench" matmul --m 1e3
refused 1 --reps "$bench" matmul --reps 0
refused 1 --experts "$bench" grouped-matmul --experts 8x
refused 1 --reps "$bench" memory-bound --workload gpt2-124m --reps 5.5
refused 1 --min-bytes "$bench" collectives --min-bytes -1
refused 1 --max-bytes "$bench" collectives --max-bytes 4096G
refused 1 --iters "$bench" collectives --iters 3abc

refused 2 --batch "$parity_dump" --out "$work/p" --batch 1e30
refused 2 --seed "$parity_dump" --out "$work/p" --seed 1.5
refused 2 --lr "$parity_dump" --out "$work/p" --lr inf

echo "PASS ($n bad values refused by name)"
