#!/usr/bin/env python3
"""Checks a Hugging Face export of an fsdp.cpp checkpoint against transformers.

`convert export CHECKPOINT OUT_DIR` writes OUT_DIR/config.json, OUT_DIR/model.safetensors and
OUT_DIR/fsdp_check_batch.safetensors: a batch of token ids ("input_ids", int64 (B, T)) and
fsdp.cpp's logits for it ("logits", float32 (B, T, vocab_size), computed on the CPU in f32).
This script loads OUT_DIR with transformers' AutoModelForCausalLM.from_pretrained, runs the
same batch and compares the logits:

    max abs error   max |theirs - ours|
    max rel error   max |theirs - ours| / max |ours|      (the number the tolerance applies to)
    argmax agree    fraction of positions whose most likely next token is the same

Pass (exit status 0) when the max rel error is within --tolerance (default 1e-2: bf16
rounding; an f32 comparison is typically near 1e-6), otherwise exit status 1.

Mixture-of-experts exports are MixtralForCausalLM. In bfloat16 a token whose router scores
nearly tie between its k-th and (k+1)-th expert can pick another expert than in f32, which
changes that token's logits, and through attention every later token's, by far more than
bf16 rounding. So for an MoE model in bfloat16 the script also runs the export in float32,
finds per sequence the first position whose top-k choice differs at any layer, and applies
the tolerance to the positions before it (a position's logits depend on it and the earlier
positions only, so there the two runs differ by rounding alone); it prints how many
positions that is, per layer how many tokens route differently, and the error over all
positions too. At least half of the positions must be routed alike.

    python3 tools/convert/check_hf_export.py OUT_DIR [--device cuda|cpu]
                                             [--dtype float32|bfloat16] [--tolerance 1e-2]

A tool for the machine where PyTorch and transformers are installed; fsdp.cpp never depends
on it.
"""

import argparse
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def top_k_choices(model, ids, k):
    """Each layer's chosen experts per token, sorted: a list of (tokens, k) tensors."""
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    return [l.reshape(-1, l.shape[-1]).float().topk(k, dim=-1).indices.sort(-1).values.cpu()
            for l in out.router_logits]


def routed_alike(args, model, ids):
    """(B, T) bool: the positions before each sequence's first token whose top-k experts, at
    any layer, differ from a float32 run of the export; prints the per-layer counts."""
    k = model.config.num_experts_per_tok
    ref = AutoModelForCausalLM.from_pretrained(args.export_dir).to(device=args.device, dtype=torch.float32).eval()
    low, high = top_k_choices(model, ids.to(args.device), k), top_k_choices(ref, ids.to(args.device), k)
    del ref
    per_layer = [(a != b).any(-1) for a, b in zip(low, high)]  # each (B*T,)
    print(f"routing: tokens whose top-{k} experts differ from a float32 run, per layer: "
          f"{[int(d.sum()) for d in per_layer]} of {per_layer[0].shape[0]}")
    differs = torch.stack(per_layer).any(0).reshape(ids.shape)
    return torch.cumsum(differs.int(), dim=1) == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export_dir", help="the directory `convert export` wrote")
    parser.add_argument("--batch", help="check batch (default: EXPORT_DIR/fsdp_check_batch.safetensors)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype transformers computes in")
    parser.add_argument("--tolerance", type=float, default=1e-2,
                        help="largest max |theirs - ours| / max |ours| that passes")
    args = parser.parse_args()

    batch = load_file(args.batch or os.path.join(args.export_dir, "fsdp_check_batch.safetensors"))
    ids = batch["input_ids"].long()
    ours = batch["logits"].double()
    print(f"batch: {tuple(ids.shape)} token ids; our logits {tuple(ours.shape)}")

    if args.device == "cuda":
        # Plain f32 matmuls on the GPU for the f32 comparison (no TF32).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    # Loaded as stored, then cast (the dtype keyword of from_pretrained differs between
    # transformers versions).
    model = AutoModelForCausalLM.from_pretrained(args.export_dir)
    model.to(device=args.device, dtype=dtype).eval()
    print(f"transformers {transformers.__version__}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} "
          f"parameters, {args.dtype} on {args.device}")

    with torch.no_grad():
        theirs = model(ids.to(args.device)).logits.double().cpu()
    if theirs.shape != ours.shape:
        print(f"FAIL: transformers gives logits {tuple(theirs.shape)}, ours are {tuple(ours.shape)}")
        return 1

    diff = (theirs - ours).abs()  # (B, T, vocab)
    scale = max(ours.abs().max().item(), 1e-30)
    experts = getattr(model.config, "num_local_experts", None)
    if experts and dtype != torch.float32:
        alike = routed_alike(args, model, ids).cpu()  # (B, T)
        held, total = int(alike.sum()), alike.numel()
        print(f"routed as in float32: {held} of {total} positions (the tolerance applies to them); "
              f"max rel error over all positions {diff.max().item() / scale:.3e}")
        if 2 * held < total:
            print("FAIL: fewer than half of the positions are routed as in float32")
            return 1
        diff, theirs, ours = diff[alike], theirs[alike], ours[alike]  # (held, vocab)

    max_abs = diff.max().item()
    max_rel = max_abs / scale
    # Elementwise relative error, over logits not close to zero.
    floor = 1e-3 * ours.abs().max().item()
    elem_rel = (diff / ours.abs().clamp_min(floor)).max().item()
    agree = (theirs.argmax(-1) == ours.argmax(-1)).double().mean().item()
    print(f"max abs error  {max_abs:.3e}")
    print(f"max rel error  {max_rel:.3e}   (tolerance {args.tolerance:g})")
    print(f"max elementwise rel error  {elem_rel:.3e}   (|logit| floored at {floor:.3e})")
    print(f"argmax agree   {agree:.4f}")
    if max_rel <= args.tolerance:
        print("PASS")
        return 0
    print("FAIL")
    return 1


if __name__ == "__main__":
    sys.exit(main())
