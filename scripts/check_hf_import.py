#!/usr/bin/env python3
"""Checks `linac import --format hf` against transformers on random LlamaForCausalLM models.

For each case below: torch.manual_seed, a LlamaForCausalLM of that config with random weights
(norm gains too, so every tensor matters), saved with save_pretrained(safe_serialization=True) in
the case's dtype; `linac import --format hf` of the folder; `linac generate --prompt-ids ...
--temperature 0 --json` on the imported checkpoint. transformers runs the same saved weights in
float32 (eager attention) and is compared with linac on
  (a) the logits after the prompt: relative error ||linac - hf|| / ||hf||
  (b) the greedy continuation: each generated token's log-probability under linac against
      transformers' log-probability of that token teacher-forced (prompt + continuation in one
      forward): largest absolute difference.
The llama3 case runs a 200-token prompt with original_max_position_embeddings 64, so most of
its frequencies are rescaled where they matter; the table also reports how far transformers'
logits move without the scaling, which must be well beyond the tolerance (else the case proves
nothing about the scaling).

Tolerances. On the GPU linac runs the imported config's train.precision, bf16: weights and
activations rounded to bf16 (unit roundoff 2^-9 = 0.2%) at every matmul input, f32 accumulation
and f32 norms, softmax and residual stream. Each layer adds a few such roundings, independent
from one another, so after 4 layers the logits carry a relative error of order 1% (the existing
export check sees 0.5-1.5% on trained models); --logit-rtol 3e-2 leaves a factor 2-3 of margin
while a wrong mapping (a swapped k/v head, a missing scaling) gives errors of order 1. Log-probs
are differences of logits: an absolute error of about rtol x |logit| ~ 0.03-0.1 for these
logits, hence --logprob-atol 0.15. With --device cpu linac computes in f32, and the defaults
tighten to 1e-4 and 1e-3 (summation order and f32 vs double RoPE frequencies only).
Exit status 0 when every case passes, 1 otherwise.

usage: scripts/check_hf_import.py --linac build-gpu/linac [--device gpu|cpu] [--torch-device cuda|cpu]
                                  [--workdir DIR] [--new-tokens N] [--logit-rtol R] [--logprob-atol A]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BASE = dict(vocab_size=512, hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
            rms_norm_eps=1e-5, initializer_range=0.05, hidden_act="silu", max_position_embeddings=4096)

# name, config overrides, dtype saved, prompt length
CASES = [
    ("gqa_untied_bf16", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0),
     torch.bfloat16, 32),
    ("llama3_scaling_bf16", dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
     torch.bfloat16, 200),
    ("tied_mha_fp32", dict(hidden_size=256, intermediate_size=688, num_attention_heads=4, num_key_value_heads=4,
                           tie_word_embeddings=True), torch.float32, 48),
]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout}{p.stderr}")
    return p.stdout


def save_random_model(cfg, dtype, folder, seed):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.to(dtype).save_pretrained(folder, safe_serialization=True)


def hf_logits(folder, ids, device):
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.to(device).eval()(torch.tensor([ids], device=device)).logits[0].double().cpu()


def without_scaling(folder):
    """A copy of the folder (weights linked) whose config.json has plain RoPE of the same theta
    (rope_scaling in transformers 4, rope_parameters in 5)."""
    plain = folder + "_plain_rope"
    os.makedirs(plain, exist_ok=True)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    cfg["rope_scaling"] = None
    if isinstance(cfg.get("rope_parameters"), dict):
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    with open(os.path.join(plain, "config.json"), "w") as f:
        json.dump(cfg, f)
    for name in os.listdir(folder):
        if name.endswith(".safetensors") or name.endswith(".index.json"):
            dst = os.path.join(plain, name)
            if not os.path.exists(dst):
                os.symlink(os.path.abspath(os.path.join(folder, name)), dst)
    return plain


def check(case, a, workdir):
    name, overrides, dtype, prompt_len = case
    cfg = LlamaConfig(**{**BASE, **overrides})
    folder = os.path.join(workdir, name)
    ckpt = os.path.join(workdir, name + ".h5")
    save_random_model(cfg, dtype, folder, seed=len(name))
    run([a.linac, "import", "--format", "hf", folder, "--out", ckpt, "--force"])
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).tolist()
    out = run([a.linac, "generate", "--checkpoint", ckpt, "--prompt-ids", ",".join(map(str, prompt)),
               "--temperature", "0", "--max-new-tokens", str(a.new_tokens), "--json", "--device", a.device])
    ours = json.loads(out[out.index("{"):])
    new = ours["sequences"][0]["tokens"]
    our_logits = torch.tensor(ours["prompt_last_logits"], dtype=torch.float64)
    our_lp = torch.tensor(ours["sequences"][0]["logprobs"], dtype=torch.float64)

    logits = hf_logits(folder, prompt + new, a.torch_device)
    hf_last = logits[len(prompt) - 1]
    rel = ((our_logits - hf_last).norm() / hf_last.norm()).item()
    pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(new))
    hf_lp = torch.log_softmax(logits, dim=-1)[pos, torch.tensor(new)]
    lp_err = (hf_lp - our_lp).abs().max().item()
    scaling_effect = None
    if "rope_scaling" in overrides:
        plain = hf_logits(without_scaling(folder), prompt, a.torch_device)[len(prompt) - 1]
        scaling_effect = ((plain - hf_last).norm() / hf_last.norm()).item()
    ok = rel <= a.logit_rtol and lp_err <= a.logprob_atol
    if scaling_effect is not None and scaling_effect < 10 * a.logit_rtol:
        ok = False
    return dict(case=name, saved=str(dtype).replace("torch.", ""), prompt=len(prompt), new=len(new),
                device=ours["device"], logits_rel_err=rel, logprob_max_abs_err=lp_err,
                scaling_effect=scaling_effect, ok=ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--linac", required=True, help="the linac binary")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"], help="linac generate --device")
    ap.add_argument("--torch-device", default=None, help="transformers' device (default: cuda when available)")
    ap.add_argument("--workdir", default=None, help="where the folders and checkpoints go (default: a temp dir)")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--logit-rtol", type=float, default=None)
    ap.add_argument("--logprob-atol", type=float, default=None)
    a = ap.parse_args()
    a.torch_device = a.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.logit_rtol is None:
        a.logit_rtol = 3e-2 if a.device == "gpu" else 1e-4
    if a.logprob_atol is None:
        a.logprob_atol = 0.15 if a.device == "gpu" else 1e-3

    with tempfile.TemporaryDirectory() as tmp:
        workdir = a.workdir or tmp
        os.makedirs(workdir, exist_ok=True)
        rows = [check(c, a, workdir) for c in CASES]
    print(f"tolerances: logits rel {a.logit_rtol:g}, log-probs abs {a.logprob_atol:g}")
    print(f"{'case':22} {'saved':9} {'prompt':>6} {'new':>4} {'dev':4} {'logits rel':>11} {'logprob abs':>12} "
          f"{'scaling effect':>15}  result")
    for r in rows:
        eff = "-" if r["scaling_effect"] is None else f"{r['scaling_effect']:.3g}"
        print(f"{r['case']:22} {r['saved']:9} {r['prompt']:>6} {r['new']:>4} {r['device']:4} "
              f"{r['logits_rel_err']:>11.3g} {r['logprob_max_abs_err']:>12.3g} {eff:>15}  "
              f"{'ok' if r['ok'] else 'FAIL'}")
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
