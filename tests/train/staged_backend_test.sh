#!/usr/bin/env bash
# The staged backend (dist.backend=staged: device buffers through pinned host memory and
# MPI, so that ranks may share a GPU) trains exactly as the MPI backend does: here on CPU
# ranks, where its buffers are host memory but its worker threads, staging slots, groups and
# stream contract are the same code. Each layout's training and validation losses must be
# bit-identical under both backends:
#   np 2: TP2 with sequence parallelism (the vocabulary-parallel head's all-reduces and
#         all-gathers, the column/row-parallel products) at ZeRO-3;
#   np 4: TP2 x CP2 (the ring's grouped send/recv) at ZeRO-2;
#   np 2: EP2 on the tiny MoE (all-to-all with uneven parts), ZeRO-3.
#
# Usage: staged_backend_test.sh TRAIN_BINARY   (run from the workspace root)
set -u
train="$1"
source tests/sh_test_support.sh staged_backend

head -c 60000 third_party/text/austen.txt > "$work/text.txt"
common=(model.n_layer=2 model.d_model=32 model.n_head=4 model.seq_length=16
        train.train_iters=4 train.micro_batch_size=2 train.eval_interval=2 train.eval_iters=1
        dataset.train_path="$work/text.txt" dataset.val_fraction=0.1 dist.device=cpu
        logger.log_interval=1 optimizer.lr=1e-2 checkpoint.save=null checkpoint.load=null)

run() {  # name ranks backend args...
  local name="$1" n="$2" backend="$3"; shift 3
  timeout 300 mpirun --oversubscribe -np "$n" "$train" "$@" "${common[@]}" \
    dist.backend="$backend" run.output_dir="$work/$name-$backend" > "$work/$name-$backend.log" 2>&1 \
    || fail "$name with dist.backend=$backend failed"
  grep -q "backend $backend" "$work/$name-$backend.log" || fail "$name: the world did not say backend $backend"
}

# Every loss, validation loss, gradient norm and balancing loss of a metrics file, in order.
records() { grep -o '"\(loss\|val_loss\|grad_norm\|moe_aux_loss\)":[^,}]*' "$1"; }

check() {  # name ranks args...
  local name="$1" n="$2"; shift 2
  run "$name" "$n" mpi "$@"
  run "$name" "$n" staged "$@"
  local want got
  want="$(records "$work/$name-mpi/metrics.jsonl")"
  got="$(records "$work/$name-staged/metrics.jsonl")"
  [ "$(echo "$want" | grep -c '"loss"')" -eq 4 ] || fail "$name: expected 4 losses, got: $want"
  [ "$got" = "$want" ] || fail "$name: the staged backend's losses differ from MPI's:
$(diff <(echo "$want") <(echo "$got"))"
  echo "ok: $name on $n ranks, staged = mpi bit for bit ($(echo "$want" | grep -c . ) values)"
}

check tp2_sp 2 --config configs/tiny.json train.global_batch_size=4 \
  model.tensor_model_parallel_size=2 model.sequence_parallel=true \
  ddp.data_parallel_sharding_strategy=optim_grads_params
check tp2_cp2 4 --config configs/tiny.json train.global_batch_size=2 \
  model.tensor_model_parallel_size=2 model.context_parallel_size=2 \
  ddp.data_parallel_sharding_strategy=optim_grads
check ep2 2 --config configs/moe-tiny.json train.global_batch_size=4 model.d_ff=64 \
  model.moe_ffn_hidden_size=32 model.moe_shared_expert_intermediate_size=32 \
  model.n_kv_head=2 model.expert_model_parallel_size=2 \
  ddp.data_parallel_sharding_strategy=optim_grads_params
echo "PASS"
