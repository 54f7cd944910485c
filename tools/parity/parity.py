#!/usr/bin/env python3
"""PyTorch parity check for fsdp.cpp models.

Reads what `parity_dump` wrote (weights.safetensors, batch.safetensors,
outputs.safetensors), runs the same model written here in plain PyTorch (its own nn.Module
code, Hugging Face-compatible math), and compares:

  * the logits and the loss of the first forward,
  * every parameter gradient of the first backward,
  * the losses of all AdamW steps (lr, betas, eps and weight decay read from the dump;
    decoupled decay on 2-D weights and embeddings only, as fsdp.cpp does).

The reference runs in float64 (TF32 off) by default, so each number printed is fsdp.cpp's own
error. For a bf16 run the reference uses the same bf16-rounded compute weights (master weights
stay in full precision, exactly as fsdp.cpp keeps f32 masters and computes with bf16 copies).

Relative error of a tensor: ||ours - ref||_2 / ||ref||_2 (over all its elements). Of the
loss sequence: max over steps of |ours - ref| / |ref|.

Pass/fail (exit status 1 on fail): every gradient's relative error must be within 1e-2 for a
bf16 run, 1e-5 for f32 (1e-9 for f64). Logits and losses are reported with the same
tolerance but only warn.

This script is a tool for the GPU machine where PyTorch is installed; the runtime never
depends on it.

    python3 tools/parity/parity.py DIR [--device cuda|cpu] [--reference float64|float32]
                                       [--json summary.json]
"""

import argparse
import json
import sys

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file

from twin_models import GPT2, Llama, loss_of

TOLERANCE = {"bf16": 1e-2, "f32": 1e-5, "f64": 1e-9}


# ----------------------------------------------------------------------------- the check

def read_config(path):
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    ints = ["n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab_size",
            "padded_vocab_size", "seq_len"]
    cfg = {k: int(meta[k]) for k in ints}
    cfg.update(family=meta["family"], norm_eps=float(meta["norm_eps"]),
               rope_theta=float(meta["rope_theta"]),
               tie_embeddings=meta["tie_embeddings"] == "true")
    return cfg


def rel_l2(ours, ref):
    ours, ref = ours.double(), ref.double()
    denom = ref.norm().item()
    diff = (ours - ref).norm().item()
    return diff / denom if denom > 0 else diff


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the --out directory of parity_dump")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reference", default="float64", choices=["float64", "float32"])
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref_dtype = getattr(torch, args.reference)
    dev = torch.device(args.device)

    cfg = read_config(f"{args.dir}/weights.safetensors")
    weights = load_file(f"{args.dir}/weights.safetensors")
    batch = load_file(f"{args.dir}/batch.safetensors")
    outputs = load_file(f"{args.dir}/outputs.safetensors")
    with safe_open(f"{args.dir}/outputs.safetensors", framework="pt") as f:
        run = f.metadata()
    dtype = run["dtype"]
    tol = TOLERANCE[dtype]
    steps = int(run["steps"])

    model = (GPT2 if cfg["family"] == "gpt2" else Llama)(cfg).to(dev, ref_dtype)
    names = [n for n, _ in model.named_parameters()]
    if sorted(names) != sorted(weights):
        missing = sorted(set(weights) - set(names))
        extra = sorted(set(names) - set(weights))
        sys.exit(f"parameter names differ: only in the dump {missing}, only here {extra}")
    params = dict(model.named_parameters())

    # Master weights in the reference precision; the model computes with their compute-dtype
    # rounding (bf16 runs) or themselves.
    masters = {n: nn.Parameter(weights[n].to(dev, ref_dtype)) for n in names}

    def install():
        with torch.no_grad():
            for n in names:
                w = masters[n]
                if dtype == "bf16":
                    w = w.to(torch.bfloat16)
                params[n].copy_(w.to(ref_dtype))

    decay = [masters[n] for n in names if masters[n].dim() == 2]
    no_decay = [masters[n] for n in names if masters[n].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(run["weight_decay"])},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=float(run["lr"]), betas=(float(run["beta1"]), float(run["beta2"])),
        eps=float(run["eps"]), foreach=False)

    idx = batch["idx"].to(dev).long()
    targets = batch["targets"].to(dev)
    ref_losses = []
    for step in range(steps):
        install()
        model.zero_grad(set_to_none=True)
        logits = model(idx)
        loss = loss_of(logits, targets, cfg["vocab_size"])
        loss.backward()
        ref_losses.append(loss.item())
        if step == 0:
            ref_logits = logits.detach()
            ref_grads = {n: params[n].grad.detach().clone() for n in names}
        for n in names:
            masters[n].grad = params[n].grad
        opt.step()

    # ---- compare
    logits_err = rel_l2(outputs["logits"].to(dev), ref_logits)
    loss_err = abs(outputs["loss"].item() - ref_losses[0]) / abs(ref_losses[0])
    grad_errs = {n: rel_l2(outputs["grad." + n].to(dev), ref_grads[n]) for n in names}
    ours_losses = outputs["losses"].tolist()
    losses_err = max(abs(a - b) / abs(b) for a, b in zip(ours_losses, ref_losses))
    worst = sorted(grad_errs.items(), key=lambda kv: -kv[1])
    grad_max = worst[0][1]
    ok = grad_max <= tol

    print(f"model {cfg['family']} layers={cfg['n_layer']} d_model={cfg['d_model']} "
          f"heads={cfg['n_head']}/{cfg['n_kv_head']} vocab={cfg['vocab_size']}/"
          f"{cfg['padded_vocab_size']}  fsdp.cpp dtype {dtype} on {run['device']}  "
          f"reference {args.reference} on {args.device}")
    print(f"batch {tuple(idx.shape)}  steps {steps}  relative error = ||ours - ref|| / ||ref||")
    print(f"{'quantity':<28}{'relative error':>16}{'tolerance':>12}")
    print(f"{'logits':<28}{logits_err:>16.3e}{tol:>12.0e}{'' if logits_err <= tol else '  WARN'}")
    print(f"{'loss (step 0)':<28}{loss_err:>16.3e}{tol:>12.0e}{'' if loss_err <= tol else '  WARN'}")
    print(f"{'gradients (max of ' + str(len(names)) + ')':<28}{grad_max:>16.3e}{tol:>12.0e}"
          f"{'' if ok else '  FAIL'}")
    print(f"{'losses of ' + str(steps) + ' AdamW steps':<28}{losses_err:>16.3e}{tol:>12.0e}"
          f"{'' if losses_err <= tol else '  WARN'}")
    print("largest gradient errors:")
    for n, e in worst[:5]:
        print(f"  {n:<40}{e:.3e}")
    print("losses (ours, reference):")
    for k, (a, b) in enumerate(zip(ours_losses, ref_losses)):
        print(f"  step {k:2d}  {a:.7f}  {b:.7f}")
    print(f"RESULT: {'PASS' if ok else 'FAIL'}: gradients within {tol:.0e}" if ok else
          f"RESULT: FAIL: {worst[0][0]} off by {grad_max:.3e} > {tol:.0e}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"family": cfg["family"], "dtype": dtype, "device": run["device"],
                       "reference": args.reference, "logits": logits_err, "loss": loss_err,
                       "grad_max": grad_max, "grad_worst": worst[0][0], "losses": losses_err,
                       "ours_losses": ours_losses, "ref_losses": ref_losses,
                       "grads": grad_errs, "pass": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
