#!/usr/bin/env python3
"""PyTorch peers of `linac bench`, run on the GPU machine in the same call (never at linac's run time).

  --attention  SDPA (is_causal) fwd and fwd+bwd at the shapes of `linac bench --op attention`
               (32768 tokens per call, B = tokens / T), and FlexAttention with a sliding window
               (torch.compile'd) where this torch has it.
  --model      Transformer++ 125M (configs/transformer_125m.json: d 768, 12 layers, 12 heads,
               SwiGLU 2048, vocab 32000, untied, 134.1M parameters) training steps: bf16 autocast,
               fused AdamW (lr 6e-4, wd 0.1), gradient clipping 1.0, T = 2048, 32768 tokens per step
               (batch 16). Prints one line per configuration, in this order: eager first, then one
               line per --compile-modes entry (default "default": plain torch.compile(model), no mode),
               so that with the defaults the last two lines are eager, then torch.compile
               (scripts/gpu_check.sh keeps `tail -2`). --compile-modes default,max-autotune-no-cudagraphs
               adds a third line; --sdpa-backend cudnn (or flash, ...) restricts SDPA to one backend.

The model is written as a competent PyTorch user would write it for speed, so that the comparison
is against a strong baseline rather than a weak one: RoPE cos/sin precomputed once (non-persistent bf16
buffers, [T, head_dim]) and applied in the activation dtype the HF/LLaMA way (q*cos + rotate_half(q)*sin);
q, k, v from one fused Linear viewed as [B, T, 3, H, D] and transposed (no copies) for
F.scaled_dot_product_attention(is_causal=True), which picks its flash backend here; SwiGLU's w1 and w3
as one Linear of 2 x 2048 outputs (same parameters and FLOPs); the loss is F.cross_entropy on the bf16
logits (autocast computes it in f32, and torch.compile fuses that upcast instead of materialising 4 GB
of f32 logits); gradients zeroed with set_to_none. The optimizer step and clipping stay outside the
compiled region. (Before, the RoPE tables were rebuilt inside every forward and applied through an f32
upcast and the loss took f32 logits: torch.compile ran ~15% below an independent LLaMA-style script.)
"""
import argparse
import contextlib
import gc
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def cuda_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def bench_attention(heads, head_dim, seq_lens, tokens, window, kv_heads):
    flex = None
    if window:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            flex = torch.compile(flex_attention)
        except Exception as e:  # older torch
            print(f"flex_attention unavailable: {e}")
            return
    kv_heads = kv_heads or heads
    gqa = kv_heads != heads
    name = f"FlexAttention window {window}" if window else "SDPA causal" + (" enable_gqa" if gqa else "")
    print(f"torch {torch.__version__} {name}, {torch.cuda.get_device_name()}, bf16, H={heads}"
          f"{f' ({kv_heads} KV)' if gqa else ''}, D={head_dim}, {tokens} tokens per call")
    print(f"{'T':>8} {'B':>5} {'fwd ms':>10} {'bwd ms':>10} {'total ms':>10}")
    for T in seq_lens:
        B = max(1, tokens // T)
        q, k, v = (torch.randn(B, h, T, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for h in (heads, kv_heads, kv_heads))
        dout = torch.randn(B, heads, T, head_dim, device="cuda", dtype=torch.bfloat16)
        if window:
            def mask(b, h, qi, ki):
                return (qi >= ki) & (qi - ki < window)
            block_mask = create_block_mask(mask, None, None, T, T)
            attn = lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)
        else:
            attn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        iters = 5 if T >= 32768 else 20

        def fwd():
            with torch.no_grad():
                attn()

        def fwd_bwd():
            attn().backward(dout)

        f = cuda_ms(fwd, iters)
        t = cuda_ms(fwd_bwd, iters)
        print(f"{T:>8} {B:>5} {f:>10.3f} {t - f:>10.3f} {t:>10.3f}")


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(T, head_dim, base=10000.0, dtype=torch.bfloat16):
    """cos and sin [T, head_dim] of the HF/LLaMA rotate-half RoPE (the angles repeated over both halves),
    computed in f32 once and stored in the activation dtype."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):  # x [B, H, T, D], cos and sin [T, D], in x's dtype as HF's LLaMA does
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # no-ops under bf16 autocast
    return x * cos + rotate_half(x) * sin


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.w13 = nn.Linear(d, 2 * ffn, bias=False)  # w1 (gate) and w3 (up) as one GEMM: the same FLOPs
        self.w2 = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        # [B, T, 3, H, D] -> three [B, H, T, D] views (no copies); SDPA takes the strided layout
        qkv = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, d // self.heads)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(a)
        g, u = self.w13(self.norm2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(g) * u)


class TransformerPP(nn.Module):
    def __init__(self, vocab=32000, d=768, layers=12, heads=12, ffn=2048, max_seq_len=2048):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        cos, sin = rope_tables(max_seq_len, d // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        # bf16 logits: autocast runs cross_entropy in f32 itself, and torch.compile fuses that upcast
        # into the softmax instead of materialising 4 GB of f32 logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}


def bench_model(seq_len, tokens, steps, compile_mode, sdpa_backend="auto"):
    """compile_mode None: eager; "default": torch.compile(model); otherwise torch.compile(model, mode=...)."""
    gc.collect()
    torch.cuda.empty_cache()
    if compile_mode is not None:
        torch.compiler.reset()  # each mode compiles from scratch
    torch.manual_seed(0)
    model = TransformerPP(max_seq_len=seq_len).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    if compile_mode is None:
        fwd = model
    elif compile_mode == "default":
        fwd = torch.compile(model)
    else:
        fwd = torch.compile(model, mode=compile_mode)
    # modes with CUDA graphs (reduce-overhead, max-autotune) want each training step marked
    cudagraphs = compile_mode in ("reduce-overhead", "max-autotune")
    B = tokens // seq_len
    idx = torch.randint(0, 32000, (B, seq_len + 1), device="cuda")
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    def step():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if sdpa_backend == "auto":
        ctx = contextlib.nullcontext()
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[sdpa_backend])])
    with ctx:
        t0 = time.time()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        warm = time.time() - t0
        ms = cuda_ms(step, steps, warmup=0)
    if compile_mode is None:
        mode = "eager"
    elif compile_mode == "default":
        mode = "torch.compile"
    else:
        mode = f"torch.compile mode={compile_mode}"
    if sdpa_backend != "auto":
        mode += f" SDPA {sdpa_backend}"
    print(f"torch {torch.__version__} Transformer++ 125M ({params / 1e6:.1f}M parameters) {mode}, "
          f"{torch.cuda.get_device_name()}, T={seq_len}, {tokens} tokens per step: {ms:.2f} ms per step, "
          f"{tokens / ms * 1e3:,.0f} tokens/s (warm-up {warm:.0f} s)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", action="store_true")
    ap.add_argument("--model", action="store_true")
    ap.add_argument("--seq-lens", default="2048,8192,32768")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (0: --heads); fewer: GQA")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile-modes", default="default",
                    help="--model: comma list of torch.compile modes, one line each after eager "
                         "(default, max-autotune-no-cudagraphs, reduce-overhead, max-autotune)")
    ap.add_argument("--sdpa-backend", default="auto", choices=["auto", *SDPA_BACKENDS],
                    help="--model: restrict SDPA to one backend (auto: torch's own choice, flash at these shapes)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.attention:
        bench_attention(args.heads, args.head_dim, [int(t) for t in args.seq_lens.split(",")], args.tokens,
                        args.window, args.kv_heads)
    if args.model:
        bench_model(2048, args.tokens, args.steps, None, args.sdpa_backend)
        for m in (m.strip() for m in args.compile_modes.split(",")):
            if m:
                bench_model(2048, args.tokens, args.steps, m, args.sdpa_backend)


if __name__ == "__main__":
    main()
