#!/usr/bin/env python3
"""Checks a `linac export --format hf` folder against linac itself on the same tokens.

Runs `linac generate --json --temperature 0` on the checkpoint (its logits after the prompt and
the log-probability of every generated token), loads the export with transformers'
AutoModelForCausalLM (no code of ours), runs it over prompt + generated tokens and compares:
  - the logits after the prompt: relative error ||hf - linac|| / ||linac||
  - each generated token's log-probability: largest absolute difference
  - HF's greedy choice at every generated position (agreement rate, reported)
Tolerances default to bf16's (linac runs the checkpoint's train.precision; HF in --dtype).
Exit status 0 when both errors are within tolerance, 1 otherwise.

usage: scripts/check_hf_export.py --linac build-gpu/linac --checkpoint CKPT --export DIR
                                  [--prompt TEXT] [--new-tokens N] [--dtype bfloat16|float32]
                                  [--logit-rtol R] [--logprob-atol A] [--device cuda|cpu]
"""
import argparse
import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--linac", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--export", required=True, help="folder written by linac export --format hf")
    ap.add_argument("--prompt", default="The history of the city begins")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--logit-rtol", type=float, default=2e-2)
    ap.add_argument("--logprob-atol", type=float, default=0.15)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    gen = subprocess.run([a.linac, "generate", "--checkpoint", a.checkpoint, "--prompt", a.prompt, "--temperature", "0",
                          "--max-new-tokens", str(a.new_tokens), "--json"], capture_output=True, text=True)
    if gen.returncode != 0:
        sys.exit(f"linac generate failed ({gen.returncode}): {gen.stdout}{gen.stderr}")
    ours = json.loads(gen.stdout[gen.stdout.index("{"):])
    prompt = ours["prompt_tokens"]
    new = ours["sequences"][0]["tokens"]
    our_logits = torch.tensor(ours["prompt_last_logits"], dtype=torch.float64)
    our_lp = torch.tensor(ours["sequences"][0]["logprobs"], dtype=torch.float64)

    model = AutoModelForCausalLM.from_pretrained(a.export, torch_dtype=getattr(torch, a.dtype)).to(a.device).eval()
    ids = torch.tensor([prompt + new], device=a.device)
    with torch.no_grad():
        logits = model(ids).logits[0].double().cpu()  # [T, V]
    hf_last = logits[len(prompt) - 1]
    rel = ((hf_last - our_logits).norm() / our_logits.norm()).item()
    lsm = torch.log_softmax(logits, dim=-1)
    pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(new))
    hf_lp = lsm[pos, torch.tensor(new)]
    lp_err = (hf_lp - our_lp).abs().max().item() if len(new) else 0.0
    agree = (logits[pos].argmax(-1) == torch.tensor(new)).double().mean().item() if len(new) else 1.0
    ok = rel <= a.logit_rtol and lp_err <= a.logprob_atol
    print(json.dumps({"export": a.export, "device": ours["device"], "hf_dtype": a.dtype, "prompt_tokens": len(prompt),
                      "new_tokens": len(new), "logits_rel_err": rel, "logprob_max_abs_err": lp_err,
                      "greedy_agreement": agree, "ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
