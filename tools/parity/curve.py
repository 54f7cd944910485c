#!/usr/bin/env python3
"""Loss-curve comparison: fsdp.cpp and a PyTorch twin over hundreds of steps.

A run of fsdp.cpp's `train` with logger.samples_file (and log_interval=1) records which
samples every step read; `convert init` writes the weights it started from. `replay` trains
the PyTorch twin (twin_models.py) from those weights on those batches with the same
recipe (learning-rate schedule, AdamW, clipping, gradient accumulation, validation) and
writes both curves, per step: training loss, gradient norm, learning rate, the update norm
per tensor group (when fsdp.cpp logged them), and the validation loss at the evaluation steps.
`independent` trains the twin PyTorch's own way instead (its own initialization and its own
shuffled sampler, seeded), the comparison a user would make. `table` summarizes curves.

    curve.py replay RUN_DIR --weights INIT.safetensors --out CURVE.json [--svg CURVE.svg]
                    [--device cuda|cpu] [--precision recipe|bf16|f32|f64] [--golden FILE]
    curve.py independent RUN_DIR --seed S --out CURVE.json [--device ...] [--precision ...]
    curve.py table [--steps 100,200,300] LABEL=CURVE.json|RUN_DIR ...

RUN_DIR is fsdp.cpp's run.output_dir: run_config.json (the resolved recipe), the metrics
file and the samples file. Data must be llm.c shards (`tokenize` writes them from text).

Precision: f64 and f32 run the twin in that dtype (TF32 off); bf16 keeps f32 weights and
computes under torch.autocast(bfloat16), PyTorch's mixed precision. `recipe` takes the
recipe's mixed_precision.compute_dtype.

This is a tool for a machine with PyTorch (and numpy); the runtime never depends on it.
"""

import argparse
import glob
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from twin_models import build, init_nanogpt, loss_of, tensor_group  # noqa: E402


# ----------------------------------------------------------------------------- files

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16,
                      "I32": torch.int32, "I64": torch.int64}


def read_safetensors(path):
    """(tensors by name, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=SAFETENSORS_DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"])
    return tensors, meta


def config_of(meta):
    ints = ["n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab_size",
            "padded_vocab_size", "seq_len"]
    cfg = {k: int(meta[k]) for k in ints}
    cfg.update(family=meta["family"], norm_eps=float(meta["norm_eps"]),
               rope_theta=float(meta["rope_theta"]), init_std=float(meta.get("init_std", 0.02)),
               tie_embeddings=meta["tie_embeddings"] == "true")
    return cfg


def model_config_of_recipe(recipe):
    """The model config fsdp.cpp resolves from a recipe (models/config.cc's defaults)."""
    m = recipe["model"]
    family, d = m["family"], m["d_model"]
    d_ff = m["d_ff"]
    if d_ff == 0:
        d_ff = 4 * d if family == "gpt2" else (8 * d // 3 + 255) // 256 * 256
    vocab = m["vocab_size"]
    padded = m["padded_vocab_size"] or (vocab + 127) // 128 * 128
    return {"family": family, "n_layer": m["n_layer"], "d_model": d, "n_head": m["n_head"],
            "n_kv_head": m["n_kv_head"] or m["n_head"], "d_ff": d_ff, "vocab_size": vocab,
            "padded_vocab_size": padded, "seq_len": m["seq_length"], "norm_eps": m["norm_eps"],
            "rope_theta": m["rope_theta"], "init_std": m["init_std"],
            "tie_embeddings": family == "gpt2" or m["tie_embeddings"]}


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_llmc_stream(pattern):
    """The tokens of an llm.c shard glob, in sorted order, as one int64 array."""
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"curve.py: no llm.c shards match '{pattern}'")
    parts = []
    for path in files:
        header = np.fromfile(path, dtype=np.int32, count=256)
        if header[0] != 20240520 or header[1] not in (1, 2):
            sys.exit(f"curve.py: {path} is not an llm.c shard")
        dtype = np.uint16 if header[1] == 1 else np.uint32
        parts.append(np.fromfile(path, dtype=dtype, offset=1024, count=int(header[2])))
    return np.concatenate(parts).astype(np.int64)


class Data:
    """The recipe's training and validation token streams, cut as fsdp.cpp cuts them."""

    def __init__(self, recipe):
        ds = recipe["dataset"]
        if ds["type"] != "llmc":
            sys.exit(f"curve.py: dataset.type '{ds['type']}': tokenize it to llm.c shards first")
        self.T = recipe["model"]["seq_length"]
        self.train = read_llmc_stream(ds["train_path"])
        total = len(self.train)
        self.train_begin, self.train_end = 0, total
        self.val = None
        if ds.get("val_path"):
            self.val, self.val_begin = read_llmc_stream(ds["val_path"]), 0
        elif ds.get("val_fraction", 0) > 0:
            cut = total - int(ds["val_fraction"] * total)
            self.train_end, self.val, self.val_begin = cut, self.train, cut
        self.train_samples = (self.train_end - self.train_begin - 1) // self.T

    def window(self, stream, offset):
        x = torch.from_numpy(stream[offset:offset + self.T + 1])
        return x[:-1], x[1:]

    def train_batch(self, offsets):
        xs, ys = zip(*(self.window(self.train, o) for o in offsets))
        return torch.stack(xs), torch.stack(ys)

    def val_batches(self, count, micro):
        """The first `count` validation samples in file order, in micro-batches."""
        n = (len(self.val) - self.val_begin - 1) // self.T
        offsets = [self.val_begin + (i % n) * self.T for i in range(count)]
        for i in range(0, count, micro):
            xs, ys = zip(*(self.window(self.val, o) for o in offsets[i:i + micro]))
            yield torch.stack(xs), torch.stack(ys)


# ----------------------------------------------------------------------------- the recipe

def lr_at(recipe, it):
    """fsdp.cpp's learning-rate schedule (Megatron's): linear warmup, then decay to min_lr."""
    o, s = recipe["optimizer"], recipe["scheduler"]
    lr, min_lr, warmup = o["lr"], o["min_lr"], s["lr_warmup_iters"]
    decay = s["lr_decay_iters"] or recipe["train"]["train_iters"]
    style = s["lr_decay_style"]
    if it < warmup:
        return lr * (it + 1) / warmup
    if style == "constant":
        return lr
    if it >= decay:
        return min_lr
    if style not in ("linear", "cosine"):
        sys.exit(f"curve.py: scheduler.lr_decay_style '{style}' is not supported here")
    ratio = (it - warmup) / (decay - warmup)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + (lr - min_lr) * coeff


def precision_of(recipe, requested):
    p = recipe["mixed_precision"]["compute_dtype"] if requested == "recipe" else requested
    if p not in ("bf16", "f32", "f64"):
        sys.exit(f"curve.py: precision '{p}'")
    return p


def newton_schulz_exact(grad, coefficients, steps, eps):
    """PyTorch's Muon iteration (torch.optim._muon) in the gradient's own dtype: the f64
    replays of the golden curves, which PyTorch's bfloat16 cast would round."""
    a, b, c = coefficients
    x = grad.clone()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def adjust_lr_like_torch(lr, adjust_lr_fn, param_shape):
    """torch.optim._muon._adjust_lr: the update's scale by the matrix's shape."""
    rows, cols = param_shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1, rows / cols))


class MuonTwin:
    """torch.optim.Muon's update on the blocks' weight matrices, as fsdp.cpp's optimizer
    "muon" chooses them: the fused qkv's q, k and v and SwiGLU's gate and up orthogonalized
    as separate matrices (each a slice of its parameter, which torch.optim.Muon cannot take
    as parameters, so its step is written out here with its own functions: the momentum's
    lerps, _zeropower_via_newtonschulz and _adjust_lr)."""

    COEFFICIENTS = (3.4445, -4.7750, 2.0315)
    EPS = 1e-7

    def __init__(self, params, cfg, o, exact):
        try:
            from torch.optim import _muon
            self.zeropower, self.adjust_lr = _muon._zeropower_via_newtonschulz, _muon._adjust_lr
            self.source = "torch.optim._muon"
        except ImportError:
            # A torch before 2.9 has no Muon: an f64 replay, which runs its own iteration
            # anyway, writes out the one formula it would take from it.
            if not exact:
                sys.exit(f"curve.py: torch {torch.__version__} has no torch.optim.Muon (2.9 or later)")
            self.zeropower, self.adjust_lr = None, adjust_lr_like_torch
            self.source = "torch.optim.Muon's rule written out (torch " + torch.__version__ + " has none)"
        self.params = params
        self.momentum, self.nesterov = o["muon_momentum"], o["muon_use_nesterov"]
        self.steps, self.weight_decay = o["muon_num_ns_steps"], o["weight_decay"]
        self.adjust_fn = o["muon_scale_mode"]
        d = cfg["d_model"] // cfg["n_head"]
        qkv = [cfg["n_head"] * d, cfg["n_kv_head"] * d, cfg["n_kv_head"] * d]
        if not o.get("muon_split_qkv", True):
            qkv = [sum(qkv)]
        self.parts = {}  # name -> the row counts of its matrices
        for n, p in params.items():
            if p.dim() != 2 or not n.endswith(".weight") or not (".attn." in n or ".mlp." in n):
                continue
            if n.endswith("attn.qkv.weight"):
                self.parts[n] = qkv
            elif n.endswith("mlp.gate_up.weight"):
                self.parts[n] = [p.size(0) // 2] * 2
            else:
                self.parts[n] = [p.size(0)]
        self.buffers = {n: torch.zeros_like(params[n]) for n in self.parts}

    @torch.no_grad()
    def step(self, lr):
        for n, rows in self.parts.items():
            p, g, buf = self.params[n], self.params[n].grad, self.buffers[n]
            buf.lerp_(g, 1 - self.momentum)
            update = g.lerp(buf, self.momentum) if self.nesterov else buf
            p.mul_(1 - lr * self.weight_decay)
            row = 0
            for r in rows:
                part = update[row:row + r]
                if part.dtype == torch.float64:
                    ortho = newton_schulz_exact(part, self.COEFFICIENTS, self.steps, self.EPS)
                else:
                    ortho = self.zeropower(part, self.COEFFICIENTS, self.steps, self.EPS)
                p[row:row + r].add_(ortho.to(p.dtype), alpha=-self.adjust_lr(lr, self.adjust_fn, part.shape))
                row += r


class Twin:
    """The PyTorch twin and its optimizer, trained step by step as the recipe says."""

    def __init__(self, recipe, cfg, device, precision):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.recipe, self.cfg, self.device, self.precision = recipe, cfg, device, precision
        dtype = torch.float64 if precision == "f64" else torch.float32
        self.model = build(cfg, sdpa=device.type == "cuda").to(device, dtype)
        self.params = dict(self.model.named_parameters())
        o = recipe["optimizer"]
        if o["optimizer"] not in ("adamw", "muon"):
            sys.exit("curve.py: only optimizer.optimizer=adamw or muon is replayed")
        self.muon = (MuonTwin(self.params, cfg, o, exact=precision == "f64")
                     if o["optimizer"] == "muon" else None)
        adam_params = {n: p for n, p in self.params.items()
                       if self.muon is None or n not in self.muon.parts}
        # Decoupled weight decay on matrices and embeddings only, as fsdp.cpp does.
        decay = [p for p in adam_params.values() if p.dim() == 2]
        rest = [p for p in adam_params.values() if p.dim() != 2]
        self.adam_lr_ratio = 1.0
        if self.muon is not None and o.get("muon_adamw_lr", 0) > 0 and o["lr"] > 0:
            self.adam_lr_ratio = o["muon_adamw_lr"] / o["lr"]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]},
             {"params": rest, "weight_decay": 0.0}],
            lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]), eps=o["adam_eps"],
            foreach=False)

    def load(self, weights):
        names = sorted(self.params)
        if names != sorted(weights):
            sys.exit(f"curve.py: parameter names differ: {sorted(set(weights) ^ set(names))}")
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(weights[n].to(p.dtype))

    def loss(self, x, y):
        x, y = x.to(self.device), y.to(self.device)
        if self.precision == "bf16":
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                return loss_of(self.model(x), y, self.cfg["vocab_size"])
        return loss_of(self.model(x), y, self.cfg["vocab_size"])

    def step(self, it, batch, want_update_norms):
        """One optimizer step on the global batch (x, y); returns its record."""
        micro = self.recipe["train"]["micro_batch_size"]
        x, y = batch
        chunks = [(x[i:i + micro], y[i:i + micro]) for i in range(0, len(x), micro)]
        self.opt.zero_grad(set_to_none=True)
        for p in self.params.values():
            p.grad = None
        total = 0.0
        for cx, cy in chunks:
            loss = self.loss(cx, cy)
            (loss / len(chunks)).backward()
            total += loss.item()
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        # fsdp.cpp's clipping: scale by max / (norm + 1e-6) when the norm exceeds max.
        clip = self.recipe["optimizer"]["clip_grad"]
        if clip > 0 and norm > clip:
            for g in grads:
                g.mul_(clip / (norm + 1e-6))
        lr = lr_at(self.recipe, it)
        for group in self.opt.param_groups:
            group["lr"] = lr * self.adam_lr_ratio
        before = ({n: p.detach().clone() for n, p in self.params.items()}
                  if want_update_norms else None)
        self.opt.step()
        if self.muon is not None:
            self.muon.step(lr)
        record = {"loss": total / len(chunks), "grad_norm": norm, "lr": lr}
        if before is not None:
            squares = {}
            for n, p in self.params.items():
                g = tensor_group(n)
                squares[g] = squares.get(g, 0.0) + float((p.detach() - before[n]).double().pow(2).sum())
            record["update_norms"] = {g: math.sqrt(v) for g, v in squares.items()}
        return record

    @torch.no_grad()
    def evaluate(self, data):
        t = self.recipe["train"]
        count = t["eval_iters"] * t["global_batch_size"]
        losses = [self.loss(x, y).item() for x, y in data.val_batches(count, t["micro_batch_size"])]
        return sum(losses) / len(losses)


def eval_steps(recipe, data):
    t = recipe["train"]
    if data.val is None or t["eval_iters"] == 0 or t["eval_interval"] == 0:
        return set()
    n = t["train_iters"]
    return {s for s in range(1, n + 1) if s % t["eval_interval"] == 0 or s == n}


def train_curve(twin, data, recipe, batches, want_update_norms, label):
    """Trains twin on batches(step) for every step; returns the curve."""
    evals = eval_steps(recipe, data)
    curve = {"loss": [], "grad_norm": [], "lr": [], "val_loss": {}, "update_norms": {}}
    train_seconds = 0.0
    for step in range(1, recipe["train"]["train_iters"] + 1):
        t0 = time.perf_counter()
        r = twin.step(step - 1, batches(step), want_update_norms)
        if step > 1:  # the first step warms up
            train_seconds += time.perf_counter() - t0
        for k in ("loss", "grad_norm", "lr"):
            curve[k].append(r[k])
        for g, v in r.get("update_norms", {}).items():
            curve["update_norms"].setdefault(g, []).append(v)
        if step in evals:
            curve["val_loss"][str(step)] = twin.evaluate(data)
        if step == 1 or step % 50 == 0 or step in evals:
            val = curve["val_loss"].get(str(step))
            print(f"{label} step {step}: loss {r['loss']:.6f} grad norm {r['grad_norm']:.4f}"
                  + (f" val {val:.6f}" if val is not None else ""), flush=True)
    t = recipe["train"]
    steps = t["train_iters"] - 1
    if steps > 0 and train_seconds > 0:
        # The step's loss.item() waits for the device, so the wall time is the device's.
        curve["tokens_per_sec"] = steps * t["global_batch_size"] * recipe["model"]["seq_length"] / train_seconds
        print(f"{label}: {curve['tokens_per_sec']:.0f} tokens/s (steps 2..{steps + 1}"
              + (", with update norms" if want_update_norms else "") + ")", flush=True)
    return curve


def fsdp_curve(run_dir, recipe):
    """fsdp.cpp's curve from its metrics file (every step must be logged)."""
    records = read_jsonl(os.path.join(run_dir, recipe["logger"]["metrics_file"]))
    n = recipe["train"]["train_iters"]
    by_step = {r["step"]: r for r in records}
    missing = [s for s in range(1, n + 1) if s not in by_step]
    if missing:
        sys.exit(f"curve.py: fsdp.cpp's metrics lack steps {missing[:5]}...: run with logger.log_interval=1")
    curve = {"loss": [], "grad_norm": [], "lr": [], "val_loss": {}, "update_norms": {}}
    for s in range(1, n + 1):
        r = by_step[s]
        for k in ("loss", "grad_norm", "lr"):
            curve[k].append(r[k])
        if r.get("val_loss") is not None:
            curve["val_loss"][str(s)] = r["val_loss"]
        for g, v in r.get("update_norms", {}).items():
            curve["update_norms"].setdefault(g, []).append(v)
    return curve


# ----------------------------------------------------------------------------- comparison

def summarize(ours, ref):
    """Differences of fsdp.cpp's curve from the twin's."""
    d = [a - b for a, b in zip(ours["loss"], ref["loss"])]
    rel = [abs(a - b) / abs(b) for a, b in zip(ours["loss"], ref["loss"])]
    tail = min(50, len(d))
    out = {"max_abs_loss_diff": max(abs(x) for x in d),
           "max_rel_loss_diff": max(rel),
           "mean_loss_diff_last_50": sum(d[-tail:]) / tail,
           "max_rel_grad_norm_diff": max(abs(a - b) / abs(b)
                                         for a, b in zip(ours["grad_norm"], ref["grad_norm"])),
           "val_loss_diff": {s: ours["val_loss"][s] - v for s, v in ref["val_loss"].items()
                             if s in ours["val_loss"]}}
    groups = sorted(set(ours["update_norms"]) & set(ref["update_norms"]))
    if groups:
        out["max_rel_update_norm_diff"] = {
            g: max(abs(a - b) / max(abs(b), 1e-30)
                   for a, b in zip(ours["update_norms"][g], ref["update_norms"][g]))
            for g in groups}
    return out


def polyline(points, x_of, y_of, color, width=1.2):
    pts = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in points)
    return f'<polyline fill="none" stroke="{color}" stroke-width="{width}" points="{pts}"/>'


def write_svg(path, title, ours, ref):
    """Two panels: both training curves with their validation points, and fsdp.cpp - twin."""
    n = len(ref["loss"])
    W, H, L, R, T, B = 900, 620, 70, 20, 40, 40
    panel = (H - T - B - 40) / 2
    x_of = lambda s: L + (s - 1) / max(n - 1, 1) * (W - L - R)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']

    def axes(top, lo, hi, label):
        y_of = lambda v: top + panel - (v - lo) / (hi - lo) * panel
        out.append(f'<rect x="{L}" y="{top}" width="{W - L - R}" height="{panel}" fill="none" stroke="#999"/>')
        for i in range(5):
            v = lo + (hi - lo) * i / 4
            out.append(f'<text x="{L - 6}" y="{y_of(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        out.append(f'<text x="14" y="{top + panel / 2}" transform="rotate(-90 14 {top + panel / 2})" '
                   f'text-anchor="middle">{label}</text>')
        return y_of

    losses = ours["loss"] + ref["loss"]
    lo, hi = min(losses), max(losses)
    y_of = axes(T, lo, hi, "training loss")
    out.append(polyline(enumerate(ref["loss"], 1), x_of, y_of, "#1f77b4"))
    out.append(polyline(enumerate(ours["loss"], 1), x_of, y_of, "#d62728"))
    for s, v in ref["val_loss"].items():
        out.append(f'<circle cx="{x_of(int(s)):.1f}" cy="{y_of(min(max(v, lo), hi)):.1f}" r="4" fill="#1f77b4"/>')
    for s, v in ours["val_loss"].items():
        out.append(f'<rect x="{x_of(int(s)) - 3:.1f}" y="{y_of(min(max(v, lo), hi)) - 3:.1f}" '
                   f'width="6" height="6" fill="#d62728"/>')
    out.append(f'<text x="{W - R - 8}" y="{T + 16}" text-anchor="end" fill="#d62728">fsdp.cpp (val: squares)</text>')
    out.append(f'<text x="{W - R - 8}" y="{T + 32}" text-anchor="end" fill="#1f77b4">PyTorch twin (val: dots)</text>')

    diff = [a - b for a, b in zip(ours["loss"], ref["loss"])]
    m = max(max(abs(x) for x in diff), 1e-12)
    top = T + panel + 40
    y_of = axes(top, -m, m, "fsdp.cpp - twin")
    out.append(f'<line x1="{L}" x2="{W - R}" y1="{y_of(0):.1f}" y2="{y_of(0):.1f}" stroke="#ccc"/>')
    out.append(polyline(enumerate(diff, 1), x_of, y_of, "#555", 1.0))
    for s, v in ref["val_loss"].items():
        if s in ours["val_loss"]:
            d = max(min(ours["val_loss"][s] - v, m), -m)
            out.append(f'<circle cx="{x_of(int(s)):.1f}" cy="{y_of(d):.1f}" r="4" fill="#2ca02c"/>')
    for i in range(5):
        s = 1 + (n - 1) * i // 4
        out.append(f'<text x="{x_of(s):.1f}" y="{H - 16}" text-anchor="middle">{s}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 2}" text-anchor="middle">step</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


# ----------------------------------------------------------------------------- commands

def load_run(run_dir):
    with open(os.path.join(run_dir, "run_config.json")) as f:
        return json.load(f)


def cmd_replay(args):
    recipe = load_run(args.run_dir)
    precision = precision_of(recipe, args.precision)
    samples_file = recipe["logger"].get("samples_file")
    if not samples_file:
        sys.exit("curve.py: the run has no logger.samples_file")
    steps = {r["step"]: r for r in read_jsonl(os.path.join(args.run_dir, samples_file))}
    weights, meta = read_safetensors(args.weights)
    cfg = config_of(meta)
    cfg["rotary_f32"] = args.rotary_f32
    data = Data(recipe)
    ours = fsdp_curve(args.run_dir, recipe)
    device = torch.device(args.device)
    twin = Twin(recipe, cfg, device, precision)
    twin.load(weights)

    def batch(step):
        offsets = [s[2] for s in steps[step]["samples"]]
        if any(o is None for o in offsets):
            sys.exit("curve.py: the samples have no token offsets (Megatron data)")
        return data.train_batch(offsets)

    ref = train_curve(twin, data, recipe, batch, bool(ours["update_norms"]), "twin")
    result = {"kind": "replay", "precision": precision, "device": args.device,
              "run_dir": args.run_dir, "model": cfg, "recipe": recipe,
              "fsdp": ours, "torch": ref, "summary": summarize(ours, ref)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    s = result["summary"]
    print(f"replay {precision}: max |loss diff| {s['max_abs_loss_diff']:.3e}, "
          f"max rel {s['max_rel_loss_diff']:.3e}; val diffs "
          + ", ".join(f"@{k} {v:+.4f}" for k, v in s["val_loss_diff"].items()))
    if args.golden:
        golden = {"what": "the PyTorch twin's curve (tools/parity/curve.py replay) from fsdp.cpp's "
                          "initial weights on fsdp.cpp's batches; tests/train/golden_curve_test.cc",
                  "torch_version": torch.__version__, "precision": precision,
                  "device": args.device, "model": cfg}
        if twin.muon is not None:
            golden["muon"] = twin.muon.source
        golden.update(ref)
        with open(args.golden, "w") as f:
            json.dump(golden, f, indent=1)
    if args.svg:
        write_svg(args.svg, f"{cfg['family']} {cfg['n_layer']}x{cfg['d_model']}, {precision}: "
                  "fsdp.cpp and its PyTorch twin, same weights and batches", ours, ref)


def cmd_independent(args):
    recipe = load_run(args.run_dir)
    precision = precision_of(recipe, args.precision)
    cfg = model_config_of_recipe(recipe)
    data = Data(recipe)
    device = torch.device(args.device)
    twin = Twin(recipe, cfg, device, precision)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        init_nanogpt(twin.model, cfg, gen)
    G = recipe["train"]["global_batch_size"]
    order = []

    def batch(step):
        # Random windows of T + 1 tokens at multiples of T, a fresh permutation per epoch.
        while len(order) < step * G:
            order.extend(torch.randperm(data.train_samples, generator=gen).tolist())
        picks = order[(step - 1) * G:step * G]
        return data.train_batch([data.train_begin + i * data.T for i in picks])

    ref = train_curve(twin, data, recipe, batch, False, f"seed {args.seed}")
    with open(args.out, "w") as f:
        json.dump({"kind": "independent", "precision": precision, "seed": args.seed,
                   "model": cfg, "recipe": recipe, "torch": ref}, f, indent=1)


def curve_of(path):
    """(curve, label suffix) of a curve JSON (its PyTorch side) or an fsdp.cpp run directory."""
    if os.path.isdir(path):
        return fsdp_curve(path, load_run(path))
    with open(path) as f:
        return json.load(f)["torch"]


def cmd_table(args):
    steps = [s for s in args.steps.split(",") if s]
    groups = {}
    for item in args.curves:
        label, _, path = item.partition("=")
        groups.setdefault(label, []).append((path, curve_of(path)))
    head = f"{'run':<34}" + "".join(f"{'val @' + s:>11}" for s in steps) + f"{'train, last 50':>16}"
    print(head)
    for label, runs in groups.items():
        rows = []
        for path, c in runs:
            vals = [c["val_loss"].get(s, float("nan")) for s in steps]
            tail = c["loss"][-50:]
            rows.append(vals + [sum(tail) / len(tail)])
            print(f"{label + ' ' + os.path.basename(path.rstrip('/')):<34.34}"
                  + "".join(f"{v:>11.4f}" for v in rows[-1]))
        if len(rows) > 1:
            mean = [sum(col) / len(col) for col in zip(*rows)]
            print(f"{label + ' (mean of ' + str(len(rows)) + ')':<34.34}" + "".join(f"{v:>11.4f}" for v in mean))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    r = sub.add_parser("replay")
    r.add_argument("run_dir")
    r.add_argument("--weights", required=True, help="convert init's output for the run's recipe")
    r.add_argument("--out", required=True)
    r.add_argument("--svg")
    r.add_argument("--golden", help="also write the twin's curve alone, as a golden-curve file")
    r.add_argument("--device", default=default_device)
    r.add_argument("--precision", default="recipe", choices=["recipe", "bf16", "f32", "f64"])
    r.add_argument("--rotary-f32", action="store_true",
                   help="the twin's rotary embedding in f32, rounded once (fsdp.cpp's arithmetic) "
                        "instead of Hugging Face's in the compute dtype")
    r.set_defaults(run=cmd_replay)
    i = sub.add_parser("independent")
    i.add_argument("run_dir", help="an fsdp.cpp run directory: its recipe is used")
    i.add_argument("--seed", type=int, required=True)
    i.add_argument("--out", required=True)
    i.add_argument("--device", default=default_device)
    i.add_argument("--precision", default="recipe", choices=["recipe", "bf16", "f32", "f64"])
    i.set_defaults(run=cmd_independent)
    t = sub.add_parser("table")
    t.add_argument("--steps", default="100,200,300")
    t.add_argument("curves", nargs="+", help="LABEL=CURVE.json or LABEL=RUN_DIR")
    t.set_defaults(run=cmd_table)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
