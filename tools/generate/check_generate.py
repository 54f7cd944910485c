#!/usr/bin/env python3
"""Greedy decoding of `generate` against transformers' generate, token for token.

Run where PyTorch and transformers are installed, on a Hugging Face directory written by
`convert export` (GPT-2 or Llama):

    python3 tools/generate/check_generate.py HF_DIR --generate bazel-bin/tools/generate/generate

Both run greedy decoding in f32 on the CPU (or --device cuda for both) from the same prompt
ids (ours, printed by `generate --print-ids`) for --max-new-tokens tokens, with and without
our key/value cache. Exit status 0 when every run produced transformers' tokens; otherwise
the first position that differs is reported with transformers' two best logits there (a
near-tie there is rounding, not a bug).
"""
import argparse
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM


def ours(args, extra):
    cmd = [args.generate, args.hf_dir, "--prompt", args.prompt, "--temperature", "0",
           "--max-new-tokens", str(args.max_new_tokens), "--device", args.device,
           "--print-ids"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    prompt_ids, new_ids = None, None
    for line in out.splitlines():
        if line.startswith("prompt ids:"):
            prompt_ids = [int(x) for x in line.split(":", 1)[1].split()]
        elif line.startswith("ids:"):
            new_ids = [int(x) for x in line.split(":", 1)[1].split()]
    if prompt_ids is None or new_ids is None:
        sys.exit(f"no ids in the output of {' '.join(cmd)}:\n{out}")
    return prompt_ids, new_ids


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hf_dir")
    p.add_argument("--generate", required=True, help="the generate binary")
    p.add_argument("--prompt", default="It is a truth universally acknowledged")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False  # true f32, as ours
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, torch_dtype=torch.float32)
    model = model.to(args.device).eval()

    # transformers' models stop at their context; ours slides past it, so only runs inside
    # the context compare.
    context = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
    failed = False
    for label, extra in (("kv cache", []), ("no cache", ["--no-kv-cache"])):
        prompt_ids, new_ids = ours(args, extra)
        if len(prompt_ids) + args.max_new_tokens > context:
            sys.exit(f"{len(prompt_ids)} prompt tokens + --max-new-tokens {args.max_new_tokens} "
                     f"exceed the model's context of {context} tokens")
        input_ids = torch.tensor([prompt_ids], device=args.device)
        with torch.no_grad():
            ref = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                 max_new_tokens=args.max_new_tokens, do_sample=False,
                                 num_beams=1, pad_token_id=model.config.eos_token_id)
        ref_ids = ref[0, len(prompt_ids):].tolist()
        if new_ids == ref_ids:
            print(f"{label}: {len(new_ids)} tokens equal transformers' generate")
            continue
        failed = True
        first = next((i for i, (a, b) in enumerate(zip(new_ids, ref_ids)) if a != b),
                     min(len(new_ids), len(ref_ids)))
        context = torch.tensor([prompt_ids + ref_ids[:first]], device=args.device)
        with torch.no_grad():
            top = torch.topk(model(context).logits[0, -1].float(), 2)
        print(f"{label}: differs at new token {first}: ours "
              f"{new_ids[first] if first < len(new_ids) else None}, transformers' "
              f"{ref_ids[first] if first < len(ref_ids) else None}; transformers' two best "
              f"logits there: {top.indices.tolist()} {top.values.tolist()}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
