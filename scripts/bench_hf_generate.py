#!/usr/bin/env python3
"""Hugging Face `generate` throughput on a `linac export --format hf` folder, for the decode
table of docs/performance.md ("Decoding") next to `linac bench --generate`: random prompts of
--prompt-len tokens, exactly --gen-len new tokens (greedy, EOS ignored), eager attention unless
--attn says otherwise; per batch size prints prefill ms (a forward over the prompts), decode
tokens/s (new tokens over the time generate takes beyond that prefill) and peak GPU memory, one
JSON line each.

usage: scripts/bench_hf_generate.py (--model DIR | --linac-config CONFIG.json) [--batch 1,16,128]
                                    [--prompt-len 512] [--gen-len 1024] [--dtype bfloat16] [--attn eager|sdpa]
                                    [--cache dynamic|static] [--compile | --loop]
--linac-config builds the same LlamaForCausalLM from a Transformer++ config with random weights
(speed does not depend on the values), for sizes that have no trained checkpoint to export.

--cache dynamic (the default) is generate's DynamicCache, one warm-up generate of 4 tokens per
batch size. --cache static: generate(cache_implementation="static"), a cache preallocated for
prompt + gen-len positions, with transformers' own compile of the decode step turned off
(generation_config.disable_compile), so that it is the eager static cache; one warm-up generate
with the timed run's shapes. --compile (with --cache static) leaves that compile on: generate then
runs its decoding forward under torch.compile with CUDA graphs (generation_config.compile_config,
transformers' documented path; wrapping model.forward in torch.compile(mode="reduce-overhead")
by hand fails inside generate, whose cache writes overwrite the graphs' outputs, seen with
transformers 5.17 / torch 2.11 on 2026-11-28). Per batch size the compile caches are reset and two
warm-up generates with the timed run's batch and --gen-len run first, so compilation and graph
capture are not timed.

--loop: not generate but the decoding loop of transformers' documentation on static caches and
torch.compile (as gpt-fast does it): a StaticCache for prompt + gen-len positions, the prompt's
forward, then per token a torch.compile(mode="reduce-overhead", fullgraph=True) function of the
model's forward on one token and the argmax, with torch.compiler.cudagraph_mark_step_begin()
before each call; two warm-up runs, then the timed one (prefill_ms: its prompt forward). prefill_ms is always the model's forward over the prompts, outside
generate: tens of milliseconds next to a decode of seconds.
"""
import argparse
import json
import sys
import time

import torch
import torch._dynamo
from transformers import AutoModelForCausalLM, LlamaConfig


def llama_config_of(path):
    """The LlamaConfig `linac export --format hf` writes for a Transformer++ config (src/export/hf_llama.cpp)."""
    m = json.load(open(path))["model"]
    d, H = m["d_model"], m["n_heads"]
    F = m.get("ffn_hidden", 0) or 256 * -(-(8 * d // 3) // 256)
    rope = m.get("mixer", {}).get("rope_base", 10000.0)
    return LlamaConfig(hidden_size=d, intermediate_size=F, num_hidden_layers=m["n_layers"], num_attention_heads=H,
                       num_key_value_heads=H, head_dim=d // H, vocab_size=m["vocab_size"],
                       rms_norm_eps=m.get("norm_eps", 1e-5), rope_theta=rope, hidden_act="silu",
                       tie_word_embeddings=m.get("tie_embeddings", False), max_position_embeddings=4096)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--linac-config")
    ap.add_argument("--batch", default="1,16,128")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attn", default="eager", help="attn_implementation: eager or sdpa")
    ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    ap.add_argument("--compile", action="store_true",
                    help="with --cache static: generate's own torch.compile of the decode step (CUDA graphs)")
    ap.add_argument("--loop", action="store_true",
                    help="the documented static-cache decoding loop under torch.compile (not generate)")
    a = ap.parse_args()
    if (a.model is None) == (a.linac_config is None):
        ap.error("give exactly one of --model and --linac-config")
    dtype = getattr(torch, a.dtype)
    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype, attn_implementation=a.attn)
    else:
        model = AutoModelForCausalLM.from_config(llama_config_of(a.linac_config), torch_dtype=dtype,
                                                 attn_implementation=a.attn)
    model = model.cuda().eval()
    if a.loop:
        return static_loop(model, a)
    if a.compile and a.cache != "static":
        ap.error("--compile needs --cache static (transformers compiles the decode step of a static cache)")
    # transformers compiles the decode step of a static cache by itself unless told not to: on only
    # with --compile
    model.generation_config.disable_compile = not a.compile
    if a.compile:
        for name in ("recompile_limit", "cache_size_limit"):  # a graph per batch size (reset per batch anyway)
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))

    static_kw = {}  # how this transformers takes cache_implementation: settled on the first generate
    if a.cache == "static":
        static_kw = {"cache_implementation": "static"}

    def generate(ids, **kw):
        nonlocal static_kw
        try:
            return model.generate(ids, **kw, **static_kw)
        except TypeError:
            if not static_kw:
                raise
            # a generate that does not take cache_implementation as an argument reads it from its config
            print("generate(cache_implementation=...) refused: setting generation_config.cache_implementation",
                  file=sys.stderr)
            model.generation_config.cache_implementation = "static"
            static_kw = {}
            return model.generate(ids, **kw)

    V = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    for B in [int(b) for b in a.batch.split(",")]:
        ids = torch.randint(0, V, (B, a.prompt_len), generator=g).cuda()
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=a.gen_len, min_new_tokens=a.gen_len,
                  pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            t0 = time.perf_counter()
            if a.compile:
                # fresh graphs for this batch's static shapes; the warm-ups have the timed run's batch,
                # prompt and gen-len, hence its static cache length: compile and capture happen here
                torch.compiler.reset()
                for _ in range(2):
                    generate(ids, **kw)
            elif a.cache == "static":
                generate(ids, **kw)  # allocates the static cache of the timed run's length
            else:
                generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
            torch.cuda.synchronize()
            warm = time.perf_counter() - t0
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            model(ids, attention_mask=mask)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = generate(ids, **kw)
            torch.cuda.synchronize()
            total = time.perf_counter() - t0
        new = out.shape[1] - a.prompt_len
        line = {"model": a.model or a.linac_config, "attn": a.attn, "dtype": a.dtype, "cache": a.cache,
                "compile": a.compile, "batch": B, "prompt_len": a.prompt_len, "gen_len": new,
                "prefill_ms": prefill * 1e3, "generate_s": total,
                "decode_tokens_per_s": B * new / max(total - prefill, 1e-9),
                "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "warmup_s": warm}
        if a.compile:
            line["compile_config"] = str(getattr(model.generation_config, "compile_config", None))
        print(json.dumps(line), flush=True)


def static_loop(model, a):
    """--loop: the prompt's forward into a StaticCache, then one compiled step per new token."""
    from transformers import StaticCache

    def decode_one(token, cache_position, cache):
        logits = model(token, cache_position=cache_position, past_key_values=cache, use_cache=True,
                       return_dict=False)[0]
        return torch.argmax(logits[:, -1], dim=-1, keepdim=True)

    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    V, L = model.config.vocab_size, a.prompt_len + a.gen_len
    g = torch.Generator(device="cpu").manual_seed(0)
    for B in [int(b) for b in a.batch.split(",")]:
        ids = torch.randint(0, V, (B, a.prompt_len), generator=g).cuda()
        torch.compiler.reset()
        try:
            cache = StaticCache(config=model.config, max_cache_len=L)
        except TypeError:  # transformers before 5 also wanted the batch, device and dtype
            cache = StaticCache(config=model.config, max_batch_size=B, max_cache_len=L, device="cuda",
                                dtype=model.dtype)

        def run():  # one cache for every run, so the compiled step's guards and graphs hold
            cache.reset()
            t0 = time.perf_counter()
            pos = torch.arange(a.prompt_len, device="cuda")
            logits = model(ids, cache_position=pos, past_key_values=cache, use_cache=True, return_dict=False)[0]
            token = torch.argmax(logits[:, -1], dim=-1, keepdim=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = [token]
            for i in range(a.gen_len - 1):
                torch.compiler.cudagraph_mark_step_begin()
                token = step(token, torch.tensor([a.prompt_len + i], device="cuda"), cache).clone()
                out.append(token)
            torch.cuda.synchronize()
            return t1 - t0, time.perf_counter() - t1, len(out)  # new tokens: one by the prompt's forward

        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(2):
                run()
            warm = time.perf_counter() - t0
            torch.cuda.reset_peak_memory_stats()
            prefill, decode, new = run()
        print(json.dumps({"model": a.model or a.linac_config, "attn": a.attn, "dtype": a.dtype, "cache": "static",
                          "loop": "torch.compile reduce-overhead, fullgraph", "batch": B,
                          "prompt_len": a.prompt_len, "gen_len": new, "prefill_ms": prefill * 1e3,
                          "decode_tokens_per_s": B * (new - 1) / decode,
                          "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "warmup_s": warm}),
              flush=True)


if __name__ == "__main__":
    main()
