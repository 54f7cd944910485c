#!/usr/bin/env python3
"""The PyTorch peer of `bench train`: the same model shapes trained the way a PyTorch user
would (bf16 autocast over f32 weights, F.scaled_dot_product_attention, fused AdamW,
torch.compile), on random tokens, one GPU. Prints tokens/s, MFU and peak memory in the form
`bench train` prints them, so scripts/gpu_validate.sh can put the two side by side in one
call.

  python3 tools/peer/torch_peer.py --workload gpt2-124m [--steps 8] [--warmup 2]
                                   [--micro-batch B] [--global-batch G] [--no-compile]
                                   [--fsdp2-cpu-offload] [--recompute] [--layers N]

Workloads: gpt2-124m (64 x 1024, 8 micro-batches per step), gpt-1.3b (16 x 2048, selective
recompute is not modelled: PyTorch keeps every activation), llama-1b (8 x 2048), llama3-8b
(Llama3-8B's shape, 1 x 8192, 16 per step: with --fsdp2-cpu-offload --recompute, the way
a PyTorch user fits it on one GPU).

--fsdp2-cpu-offload: FSDP2 (fully_shard on every block, then the root, a world of one) with
CPUOffloadPolicy (parameters, gradients and AdamW on the host) and MixedPrecisionPolicy
(bf16 compute, f32 reduction) instead of autocast; torch.compile per block, as torchtitan
applies it. The host then holds about 18 bytes a parameter (f32 weights, gradients and
AdamW's two moments, 16, and the page-locked tensors' rounding), 135 GiB for the 8B: when the
host's available memory cannot hold that and 16 GiB more, the peer trains the largest number
of blocks that fits and says so.
--recompute: activation checkpointing of every block (non-reentrant). --layers N: N blocks
instead of the workload's.
MFU counts 6 N + 12 layers d_model seq FLOP per token against 989 TFLOP/s, as bench does.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WORKLOADS = {
    # family, layers, d_model, heads, kv heads, d_ff, seq, vocab (padded), micro, global
    "gpt2-124m": ("gpt2", 12, 768, 12, 12, 3072, 1024, 50304, 64, 512),
    "gpt-1.3b": ("gpt2", 24, 2048, 16, 16, 8192, 2048, 50304, 16, 32),
    "llama-1b": ("llama", 16, 2048, 32, 8, 8192, 2048, 50304, 8, 32),
    "llama3-8b": ("llama", 32, 4096, 32, 8, 14336, 8192, 128256, 1, 16),
}
PEAK_FLOPS = 989e12


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotary(x, cos, sin):  # x (B, H, T, D)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, family, d, heads, kv_heads, d_ff):
        super().__init__()
        self.family, self.heads, self.kv_heads, self.hd = family, heads, kv_heads, d // heads
        gpt2 = family == "gpt2"
        norm = (lambda: nn.LayerNorm(d)) if gpt2 else (lambda: RMSNorm(d))
        self.ln1, self.ln2 = norm(), norm()
        self.qkv = nn.Linear(d, d + 2 * kv_heads * self.hd, bias=gpt2)
        self.proj = nn.Linear(d, d, bias=gpt2)
        self.fc = nn.Linear(d, d_ff if gpt2 else 2 * d_ff, bias=gpt2)
        self.fc_proj = nn.Linear(d_ff, d, bias=gpt2)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(
            [C, self.kv_heads * self.hd, self.kv_heads * self.hd], dim=-1)
        q = q.view(B, T, self.heads, self.hd).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        if self.family == "llama":
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.fc(self.ln2(x))
        if self.family == "gpt2":
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return x + self.fc_proj(h)


class Model(nn.Module):
    def __init__(self, family, layers, d, heads, kv_heads, d_ff, seq, vocab):
        super().__init__()
        self.family = family
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d) if family == "gpt2" else None
        self.blocks = nn.ModuleList(Block(family, d, heads, kv_heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d) if family == "gpt2" else RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if family == "gpt2":
            self.head.weight = self.wte.weight  # tied, as GPT-2
        hd = d // heads
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    recompute = False  # activation checkpointing of every block

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        # On the tokens' device (under CPU offload FSDP2 may leave buffers on the host) and in
        # the activations' dtype (FSDP2's MixedPrecisionPolicy casts parameters, not buffers:
        # f32 angles would turn the rotated queries and keys f32 beside bf16 values).
        cos = self.cos[:T].to(device=idx.device, dtype=x.dtype)
        sin = self.sin[:T].to(device=idx.device, dtype=x.dtype)
        for b in self.blocks:
            if self.recompute:
                x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False)
            else:
                x = b(x, cos, sin)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def host_available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("torch peer: /proc/meminfo has no MemAvailable line")


def layers_fitting_host(family, layers, d, heads, kv_heads, d_ff, vocab):
    """The most blocks (at most `layers`) whose f32 weights, gradients and two AdamW moments
    fit the host's available memory less 16 GiB for the process (PyTorch, the CUDA context's
    host side, torch.compile's worker processes). 18 bytes a parameter, not 16: the weights
    and gradients are page-locked through PyTorch's caching host allocator, which rounds each
    tensor to a power of two (an 8B block's f32 tensors by 15%). At 16 bytes and 8 GiB, 31 of
    the 8B's 32 blocks on a host with 124 GiB available were killed for host memory in their
    first step."""
    hd = d // heads
    mlp = (1 if family == "gpt2" else 2) * d * d_ff + d_ff * d
    block = d * (d + 2 * kv_heads * hd) + d * d + mlp + 2 * d
    rest = 2 * vocab * d + d  # embedding, head (untied), final norm
    budget = host_available_bytes() - 16 * 2**30
    return max(0, min(layers, (budget // 18 - rest) // block))


def fsdp2_cpu_offload(model, compile_blocks):
    """FSDP2 over a world of one with the parameters offloaded to the host, torchtitan's way:
    each block compiled, then sharded; the root last."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy()
    for i, block in enumerate(model.blocks):
        if compile_blocks:
            block = torch.compile(block)
            model.blocks.register_module(str(i), block)
        fully_shard(block, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--micro-batch", type=int)
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--fsdp2-cpu-offload", action="store_true")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--layers", type=int)
    a = ap.parse_args()
    family, layers, d, heads, kv, d_ff, seq, vocab, micro, glob = WORKLOADS[a.workload]
    layers = a.layers or layers
    fit_note = ""
    if a.fsdp2_cpu_offload:
        fitting = layers_fitting_host(family, layers, d, heads, kv, d_ff, vocab)
        if fitting < 1:
            raise SystemExit("torch peer: the host's available memory holds no block's f32 "
                             "weights, gradients and AdamW moments")
        if fitting < layers:
            fit_note = (f", {fitting} of {layers} blocks (the most whose 16 bytes a parameter "
                        f"fit the host's {host_available_bytes() / 2**30:.0f} GiB available)")
            print(f"torch peer: {layers} blocks do not fit the host; training {fitting}", flush=True)
            layers = fitting
    micro = a.micro_batch or micro
    glob = a.global_batch or glob
    accum = max(1, glob // micro)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    if a.fsdp2_cpu_offload:
        model = Model(family, layers, d, heads, kv, d_ff, seq, vocab)  # on the host
        n_params = sum(p.numel() for p in model.parameters())
        model.recompute = a.recompute
        step_fn = fsdp2_cpu_offload(model, compile_blocks=not a.no_compile)
        # The parameters and their gradients are host tensors: AdamW runs on the host, one
        # tensor at a time (foreach would add a temporary the size of every moment).
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=False)
    else:
        model = Model(family, layers, d, heads, kv, d_ff, seq, vocab).to(dev)
        n_params = sum(p.numel() for p in model.parameters())  # every parameter, as bench counts
        model.recompute = a.recompute
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
        step_fn = model if a.no_compile else torch.compile(model)
    autocast = not a.fsdp2_cpu_offload  # FSDP2's MixedPrecisionPolicy casts instead
    gen = torch.Generator(device=dev).manual_seed(1)

    def batch():
        t = torch.randint(0, 50257, (micro, seq + 1), device=dev, generator=gen)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    times = []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(accum):
            x, y = batch()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = step_fn(x, y) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        # One line a step, so that a run stopped by a time limit still says how fast it went.
        print(f"step {step + 1}/{a.warmup + a.steps}{' (warm-up)' if step < a.warmup else ''}: "
              f"{1e3 * dt:.1f} ms, {micro * seq * accum / dt / 1e3:.2f}K tokens/s", flush=True)
        if step >= a.warmup:
            times.append(dt)
    step_s = sum(times) / len(times)
    tokens = micro * seq * accum
    tps = tokens / step_s
    flop_per_token = 6 * n_params + 12 * layers * d * seq
    print(f"# torch peer: {a.workload}, torch {torch.__version__}, "
          f"{'eager' if a.no_compile else 'torch.compile'}"
          f"{', FSDP2 + CPUOffloadPolicy' if a.fsdp2_cpu_offload else ''}"
          f"{', every block recomputed' if a.recompute else ''}{fit_note}, "
          f"{n_params / 1e9:.2f}B parameters, micro-batch {micro} x {seq}, "
          f"{accum} per step, {a.steps} timed steps after {a.warmup} warm-up")
    print(f"tokens/s total     {tps / 1e3:.1f}K")
    print(f"MFU                {100 * tps * flop_per_token / PEAK_FLOPS:.1f}%")
    print(f"peak allocated     {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print(f"step time          {1e3 * step_s:.1f} ms")
    if not math.isfinite(loss.item()):
        raise SystemExit("torch peer: the loss is not finite")


if __name__ == "__main__":
    main()
