#!/usr/bin/env python3
"""flash-linear-attention (fla) peers of `linac bench`, run on the GPU machine in the same call (never
at linac's run time). fla is not a dependency: scripts/gpu_check.sh's `fla` mode puts a source
snapshot of it (and of einops, which it imports) under .peers/ on PYTHONPATH (docs/performance.md,
"How these were measured", says how to make that snapshot).

  --model  fla's own GLAForCausalLM at configs/gla_340m.json's shape (d 1024, 24 layers, 4 heads,
           expand_k 0.5, expand_v 1, SwiGLU 2816 from hidden_ratio 4, low-rank forget gate of rank
           16 with normaliser 16, output gate, vocab 32000, untied), written as fla's users train it
           at their best: its chunked Triton GLA kernel, fused RMSNorm + gate, fused SwiGLU, fused
           cross-entropy (fla's defaults), fp32 parameters under bf16 autocast, fused AdamW (lr 3e-4,
           wd 0.01), clipping 1.0, T = 2048, 32,768 tokens per step (batch 16). One line eager, then
           one with torch.compile(model) (or why it failed). fla's gate clamp is left at its default
           (none; linac's config clamps at -3), which changes no FLOP.
  --ops    (after --model) fla's kernels at the shapes of `linac bench --op`, fwd and fwd+bwd, median of --iters:
           chunk_gla (H 4, Dk 128, Dv 256), chunk_simple_gla with a per-head decay (lightning: H 16,
           D 64), parallel_based and fused_chunk_based (Taylor: H 16, F 16, Dv 64); 32,768 tokens per
           call, B = tokens / T.
On a fresh machine the first call of each fla kernel autotunes and compiles it (Triton): the model's
first step took more than 430 s on an H100 (2026-12-07). Give this script a call of its own, with the
Triton cache of the calls before it (scripts/gpu_check/peers.sh, the `fla` mode, keeps it).
"""
import argparse
import faulthandler
import gc
import sys
import time

import torch

from bench_torch import cuda_ms  # scripts/ is the script's own folder, first on sys.path


def gla_340m_config():
    from fla.models import GLAConfig
    return GLAConfig(hidden_size=1024, num_hidden_layers=24, num_heads=4, expand_k=0.5, expand_v=1.0,
                     hidden_ratio=4, vocab_size=32000, tie_word_embeddings=False, attn_mode="chunk",
                     use_output_gate=True, use_short_conv=False, fuse_norm=True, fuse_swiglu=True,
                     fuse_cross_entropy=True, use_cache=False, max_position_embeddings=2048)


def bench_model(seq_len, tokens, steps, compiled):
    from fla.models import GLAForCausalLM
    gc.collect()
    torch.cuda.empty_cache()
    torch.compiler.reset()
    torch.manual_seed(0)
    cfg = gla_340m_config()
    model = GLAForCausalLM(cfg).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    if compiled:
        # fla's layers read their integer layer_idx, which dynamo treats as static, so each layer
        # compiles its own graph; past the default recompile limit (8) the rest would run eager. Making
        # the int dynamic instead (allow_unspec_int_on_nn_module) failed with a garbage shape in torch
        # 2.11 (2026-12-07).
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * cfg.num_hidden_layers)
    fwd = torch.compile(model) if compiled else model
    B = tokens // seq_len
    # fla shifts the labels itself (the last position predicts nothing), as HF models do.
    ids = torch.randint(0, cfg.vocab_size, (B, seq_len), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    mode = "torch.compile" if compiled else "eager"
    try:
        t0 = time.time()
        for i in range(3):
            step()
            torch.cuda.synchronize()
            # The first step autotunes and compiles every Triton kernel (minutes on a fresh machine).
            print(f"fla GLA 340M {mode}: warm-up step {i + 1} done at {time.time() - t0:.0f} s", flush=True)
        warm = time.time() - t0
        ms = cuda_ms(step, steps, warmup=0)
    except Exception as e:  # a compile failure is a result to report, not a reason to stop
        print(f"fla GLA 340M {mode}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        return
    import fla
    print(f"torch {torch.__version__} fla {fla.__version__} GLA 340M ({params / 1e6:.1f}M parameters) {mode}, "
          f"{torch.cuda.get_device_name()}, T={seq_len}, {tokens} tokens per step: {ms:.2f} ms per step, "
          f"{tokens / ms * 1e3:,.0f} tokens/s (warm-up {warm:.0f} s)", flush=True)


def time_op(name, T, fn, inputs, iters):
    """fwd and fwd+bwd of fn(*inputs) -> o (or (o, state)), with a random output gradient."""
    def fwd():
        with torch.no_grad():
            fn(*inputs)

    out = fn(*inputs)
    o = out[0] if isinstance(out, tuple) else out
    do = torch.randn_like(o)

    def fwd_bwd():
        out = fn(*inputs)
        (out[0] if isinstance(out, tuple) else out).backward(do)
        for x in inputs:
            if isinstance(x, torch.Tensor):
                x.grad = None

    f, fb = cuda_ms(fwd, iters), cuda_ms(fwd_bwd, iters)
    print(f"fla {name} T={T}: fwd {f:.3f} ms, bwd {fb - f:.3f} ms, fwd+bwd {fb:.3f} ms", flush=True)


def bench_ops(seq_lens, tokens, iters):
    from fla.ops.based import fused_chunk_based, parallel_based
    from fla.ops.gla import chunk_gla
    from fla.ops.simple_gla import chunk_simple_gla
    dev, bf = "cuda", torch.bfloat16

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, dtype=bf) * scale).requires_grad_()

    for T in seq_lens:
        B = tokens // T
        torch.manual_seed(0)
        # GLA: the forget gate in log space, as linac's (log sigmoid of a logit, over a temperature of 16).
        q, k, v = rand(B, T, 4, 128), rand(B, T, 4, 128), rand(B, T, 4, 256)
        g = (torch.nn.functional.logsigmoid(torch.randn(B, T, 4, 128, device=dev)) / 16).to(bf).requires_grad_()
        time_op("chunk_gla (H 4, Dk 128, Dv 256)", T, lambda *a: chunk_gla(*a, scale=128 ** -0.5),
                [q, k, v, g], iters)
        # Lightning: one decay per head (TransNormerLLM's slopes), the state kept across chunks.
        q, k, v = rand(B, T, 16, 64), rand(B, T, 16, 64), rand(B, T, 16, 64)
        slopes = torch.tensor([-(2 ** (-8 * (h + 1) / 16)) for h in range(16)], device=dev, dtype=torch.float32)
        time_op("chunk_simple_gla, decay per head (H 16, D 64)", T,
                lambda *a: chunk_simple_gla(*a, g_gamma=slopes, scale=64 ** -0.5), [q, k, v], iters)
        # Taylor (Based): F = 16 feature dims, Dv 64, 16 heads, normalised.
        q, k, v = rand(B, T, 16, 16), rand(B, T, 16, 16), rand(B, T, 16, 64)
        time_op("parallel_based (H 16, F 16, Dv 64)", T, lambda *a: parallel_based(*a, use_norm=True),
                [q, k, v], iters)
        time_op("fused_chunk_based (H 16, F 16, Dv 64)", T, lambda *a: fused_chunk_based(*a, use_norm=True),
                [q, k, v], iters)
        del q, k, v, g
        gc.collect()
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="store_true")
    ap.add_argument("--ops", action="store_true")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--no-compile", action="store_true", help="--model: the eager line only")
    only.add_argument("--no-eager", action="store_true", help="--model: the torch.compile line only")
    ap.add_argument("--seq-lens", default="2048,8192,32768")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--stacks-every", type=float, default=90,
                    help="print every thread's Python stack each this many seconds (0: never), so that a call "
                         "cut by its time limit shows where it was: autotuning, compiling or stuck")
    args = ap.parse_args()
    if args.stacks_every > 0:
        faulthandler.dump_traceback_later(args.stacks_every, repeat=True, file=sys.stdout)
    torch.backends.cuda.matmul.allow_tf32 = True
    # The model first: issue 49's GLA goal is stated against it, and on a fresh machine every fla
    # kernel's first call autotunes and compiles for minutes.
    if args.model:
        if not args.no_eager:
            bench_model(2048, args.tokens, args.steps, False)
        if not args.no_compile:
            bench_model(2048, args.tokens, args.steps, True)
    if args.ops:
        bench_ops([int(t) for t in args.seq_lens.split(",")], args.tokens, args.iters)


if __name__ == "__main__":
    main()
