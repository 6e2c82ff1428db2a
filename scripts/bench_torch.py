#!/usr/bin/env python3
"""PyTorch peers of `linac bench`, run on the GPU machine in the same call (never at linac's run time).

  --attention  SDPA (is_causal) fwd and fwd+bwd at the shapes of `linac bench --op attention`
               (32768 tokens per call, B = tokens / T), and FlexAttention with a sliding window
               (torch.compile'd) where this torch has it.
  --model      Transformer++ 125M (configs/transformer_125m.json: d 768, 12 layers, 12 heads,
               SwiGLU 2048, vocab 32000, untied) training steps, eager and torch.compile: bf16
               autocast, fused AdamW, T = 2048, 32768 tokens per step.
"""
import argparse
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


def rope_tables(T, head_dim, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim)
    ang = torch.outer(torch.arange(T, device="cuda").float(), inv)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # x [B, H, T, D], rotating the two halves of each head
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, ffn, bias=False)
        self.w3 = nn.Linear(d, ffn, bias=False)
        self.w2 = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(a)
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TransformerPP(nn.Module):
    def __init__(self, vocab=32000, d=768, layers=12, heads=12, ffn=2048):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head_dim = d // heads

    def forward(self, idx, targets):
        cos, sin = rope_tables(idx.shape[1], self.head_dim)
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def bench_model(seq_len, tokens, steps, compile_):
    torch.manual_seed(0)
    model = TransformerPP().cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compile_ else model
    B = tokens // seq_len
    idx = torch.randint(0, 32000, (B, seq_len + 1), device="cuda")
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.time()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    ms = cuda_ms(step, steps, warmup=0)
    mode = "torch.compile" if compile_ else "eager"
    print(f"torch {torch.__version__} Transformer++ 125M ({params / 1e6:.1f}M parameters) {mode}, "
          f"{torch.cuda.get_device_name()}, T={seq_len}, {tokens} tokens per step: {ms:.2f} ms per step, "
          f"{tokens / ms * 1e3:,.0f} tokens/s (warm-up {warm:.0f} s)")


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
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.attention:
        bench_attention(args.heads, args.head_dim, [int(t) for t in args.seq_lens.split(",")], args.tokens,
                        args.window, args.kv_heads)
    if args.model:
        for c in (False, True):
            bench_model(2048, args.tokens, args.steps, c)


if __name__ == "__main__":
    main()
