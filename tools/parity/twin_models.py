"""fsdp.cpp's models written in plain PyTorch: the twins the parity check (parity.py) and the
loss-curve comparison (curve.py) train beside fsdp.cpp.

Parameter names, shapes and layouts are fsdp.cpp's own (a fused qkv projection with rows
[q heads | k heads | v heads], a fused SwiGLU gate_up with rows [gate; up], the embedding
padded to padded_vocab_size rows), so a weights file written by fsdp.cpp loads as is. The
math is Hugging Face's (GPT-2 with the tanh GELU, Llama with its rotary embedding and
repeat_kv grouping).

Attention is computed explicitly (scores, mask, softmax) by default, which is exact in
float64 on any device; `sdpa=True` uses torch's fused scaled_dot_product_attention instead
(the fast path on a GPU, same math).
"""

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x, theta, in_f32=False):
    """Hugging Face Llama's rotary embedding of x (B, H, T, D): in x's dtype (its cosines,
    sines and products rounded to bf16 under autocast), or, with in_f32, in f32 rounded once
    to x's dtype, as fsdp.cpp computes it (a diagnostic: which of the two a bf16 curve
    follows)."""
    d, t = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64, device=x.device), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    if in_f32 and x.dtype != torch.float64:
        xf = x.float()
        return (xf * emb.cos().float() + rotate_half(xf) * emb.sin().float()).to(x.dtype)
    return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)


class Attention(nn.Module):
    """Causal self-attention with a fused qkv projection: rows [q heads | k heads | v heads]."""

    def __init__(self, cfg, bias, rope_theta, sdpa=False):
        super().__init__()
        self.h, self.hkv = cfg["n_head"], cfg["n_kv_head"]
        self.d = cfg["d_model"] // self.h
        self.rope_theta = rope_theta
        self.rotary_f32 = bool(cfg.get("rotary_f32", False))
        self.sdpa = sdpa
        self.qkv = nn.Linear(cfg["d_model"], (self.h + 2 * self.hkv) * self.d, bias=bias)
        self.proj = nn.Linear(self.h * self.d, cfg["d_model"], bias=bias)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], -1)
        q = q.view(b, t, self.h, self.d).transpose(1, 2)     # (B, H, T, D)
        k = k.view(b, t, self.hkv, self.d).transpose(1, 2)   # (B, Hkv, T, D)
        v = v.view(b, t, self.hkv, self.d).transpose(1, 2)
        if self.rope_theta:
            q = rotary(q, self.rope_theta, self.rotary_f32)
            k = rotary(k, self.rope_theta, self.rotary_f32)
        rep = self.h // self.hkv  # Hugging Face's repeat_kv: query head i uses kv head i // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)  # (B, H, T, T)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v                  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.h * self.d))


class GPT2Block(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        c, eps = cfg["d_model"], cfg["norm_eps"]
        self.ln_1 = nn.LayerNorm(c, eps=eps)
        self.attn = Attention(cfg, bias=True, rope_theta=0, sdpa=sdpa)
        self.ln_2 = nn.LayerNorm(c, eps=eps)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(c, cfg["d_ff"])
        self.mlp.proj = nn.Linear(cfg["d_ff"], c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = F.gelu(self.mlp.fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.proj(h)


class GPT2(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(cfg["padded_vocab_size"], cfg["d_model"])
        self.wpe = nn.Embedding(cfg["seq_len"], cfg["d_model"])
        self.h = nn.ModuleList(GPT2Block(cfg, sdpa) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(cfg["d_model"], eps=cfg["norm_eps"])

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head, (B, T, Vp)


class LlamaBlock(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        c, eps = cfg["d_model"], cfg["norm_eps"]
        self.attn_norm = RMSNorm(c, eps)
        self.attn = Attention(cfg, bias=False, rope_theta=cfg["rope_theta"], sdpa=sdpa)
        self.mlp_norm = RMSNorm(c, eps)
        self.mlp = nn.Module()
        self.mlp.gate_up = nn.Linear(c, 2 * cfg["d_ff"], bias=False)  # rows [gate; up]
        self.mlp.proj = nn.Linear(cfg["d_ff"], c, bias=False)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        gate, up = self.mlp.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp.proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, cfg, sdpa=False):
        super().__init__()
        self.embed = nn.Embedding(cfg["padded_vocab_size"], cfg["d_model"])
        self.layers = nn.ModuleList(LlamaBlock(cfg, sdpa) for _ in range(cfg["n_layer"]))
        self.norm = RMSNorm(cfg["d_model"], cfg["norm_eps"])
        self.tied = cfg["tie_embeddings"]
        if not self.tied:
            self.lm_head = nn.Linear(cfg["d_model"], cfg["padded_vocab_size"], bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.layers:
            x = block(x)
        x = self.norm(x)
        return x @ self.embed.weight.t() if self.tied else self.lm_head(x)


def build(cfg, sdpa=False):
    return (GPT2 if cfg["family"] == "gpt2" else Llama)(cfg, sdpa)


def loss_of(logits, targets, vocab):
    """Mean cross-entropy over the real vocabulary (padded columns excluded), -1 ignored."""
    return F.cross_entropy(logits[..., :vocab].reshape(-1, vocab), targets.reshape(-1).long(),
                           ignore_index=-1)


def init_nanogpt(model, cfg, generator):
    """nanoGPT's initialization, drawn by PyTorch (independent of fsdp.cpp's): normal(0,
    init_std) for matrices and embeddings, for GPT-2 init_std / sqrt(2 n_layer) for the
    projections into the residual stream, zero biases, unit norm gains."""
    std = cfg.get("init_std", 0.02)
    scaled = std / math.sqrt(2 * cfg["n_layer"]) if cfg["family"] == "gpt2" else std
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                s = scaled if name.endswith("proj.weight") else std
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * s)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def tensor_group(name):
    """A parameter's tensor group: its name with the layer numbers replaced by '*' (as
    fsdp.cpp's logger.log_update_norms groups them)."""
    return re.sub(r"(?<![^.])\d+(?![^.])", "*", name)
