#!/usr/bin/env python3
"""Reads the kernel timelines scripts/kernel_trace.cpp wrote (one CSV per rank in DIR) and prints,
per rank, every training step's duration (a step ends with its last AdamW kernel) and, for the
last full step, the time the GPU computed, idled and ran NCCL, the NCCL kernels with the compute
kernels beside each, and the compute kernels' total time by name.

    scripts/kernel_trace.py DIR [--top 25] [--beside 6]

With --decode it reads a greedy decoding run instead (`linac bench --generate`, whose steps each
end with a greedy_pick kernel): the mean GPU time of the last --steps steps from the first kernel
to that pick, how much of it kernels ran, the kernels per step and their time per step by name,
both from each kernel's start and on the chain: from the later of its start and the end of the
kernels before it. A dependent launch (Ctx::dependent_launches) starts before the kernel ahead
ends and waits; the first figure counts that wait, the second does not, so the second adds up to
the step's busy time and says what each kernel adds to the step.

With --whole it reads a run that has no training steps (`linac bench --op ...`): the whole
timeline's span and busy time and every kernel's total by name, divided by --calls (the op calls
the run made, so that each figure is per call).

    scripts/kernel_trace.py DIR --whole [--calls N]
"""
import argparse
import collections
import glob
import os
import re
import sys


def load(path):
    """Kernels of one CSV as (start_ns, end_ns, stream, grid_x, name), by start."""
    rows = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split(",", 5)
            if len(p) == 6:
                rows.append((int(p[0]), int(p[1]), int(p[3]), int(p[4]), p[5]))
    rows.sort()
    return rows


def is_nccl(name):
    return "nccl" in name.lower()


def short(name):
    """A readable kernel name: linac's kernel function, cuBLASLt's nvjet name, NCCL's collective."""
    m = re.search(r"ncclDevKernel_(\w+)", name)
    if m:
        return "nccl " + m.group(1)
    m = re.search(r"(nvjet\w+|splitKreduce_kernel)", name)
    if m:
        return m.group(1)
    if name.startswith("_ZN"):  # the last name of an Itanium-mangled nested name (_ZN 5linac 4attn 15bwd...)
        pos, last = 3, None
        while (m := re.match(r"\d+", name[pos:])):
            n = int(m.group(0))
            pos += len(m.group(0))
            last = name[pos:pos + n]
            pos += n
        if last:
            return last
    return name[:60]


def step_ends(rows):
    """Index of each step's last kernel: the last of every run of consecutive AdamW kernels."""
    ends = []
    for i, r in enumerate(rows):
        if "adamw" in r[4] and (i + 1 == len(rows) or "adamw" not in rows[i + 1][4]):
            ends.append(i)
    return ends


def busy_ns(intervals):
    total, cur = 0, None
    for s, e in sorted(intervals):
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur else 0)


def totals_by_name(rows):
    """{short name: [calls, us]} of the kernels in rows."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        t = totals[short(r[4])]
        t[0] += 1
        t[1] += (r[1] - r[0]) / 1e3
    return totals


def summarize(rows, top=25, beside=6):
    ends = step_ends(rows)
    out = []
    steps = [(rows[b][1] - rows[a][1]) / 1e6 for a, b in zip(ends, ends[1:])]
    out.append("steps (ms): " + ", ".join(f"{s:.2f}" for s in steps))
    if not steps:
        return out
    first, last = ends[-2] + 1, ends[-1] + 1
    step = rows[first:last]
    t0 = rows[ends[-2]][1]
    comp = [r for r in step if not is_nccl(r[4])]
    nccl = [r for r in step if is_nccl(r[4])]
    span = (step[-1][1] - t0) / 1e3
    busy = busy_ns([(r[0], r[1]) for r in comp]) / 1e3
    out.append(f"last step: {span:.0f} us, compute busy {busy:.0f}, idle {span - busy:.0f}, "
               f"{len(nccl)} NCCL kernels for {sum(r[1] - r[0] for r in nccl) / 1e3:.0f} us")
    for n in nccl:
        near = [c for c in comp if c[0] < n[1] and c[1] > n[0]]
        desc = ", ".join(f"{short(c[4])} ({(c[1] - c[0]) / 1e3:.0f})" for c in near[:beside])
        out.append(f"  +{(n[0] - t0) / 1e3:9.0f} us {(n[1] - n[0]) / 1e3:7.0f} us beside: {desc or 'nothing'}")
    totals = totals_by_name(comp)
    out.append("compute kernels, us in the last step (calls):")
    for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"  {us:9.0f} ({calls:4d})  {name}")
    return out


def summarize_decode(rows, top, steps):
    """The last `steps` decoding steps of a greedy run: per-step span, busy time and kernels."""
    ends = [i for i, r in enumerate(rows) if "greedy_pick" in r[4]]
    if len(ends) < steps + 1:
        return [f"  only {len(ends)} decoding steps in the trace"]
    first, last = ends[-steps - 1] + 1, ends[-1]
    span = sum(rows[e][1] - rows[s + 1][0] for s, e in zip(ends[-steps - 1:-1], ends[-steps:])) / 1e3 / steps
    window = rows[first:last + 1]
    totals = totals_by_name(window)
    chain, reached = collections.defaultdict(float), window[0][0]
    for start, end, _, _, name in window:  # by start: what each kernel adds past those before it
        chain[short(name)] += max(0, end - max(start, reached)) / 1e3
        reached = max(reached, end)
    busy = sum(chain.values()) / steps
    out = [f"  {steps} steps: {span:.1f} us per step from its first kernel to its pick, kernels busy {busy:.1f} us, "
           f"{(last + 1 - first) / steps:.1f} kernels per step",
           "  us/step  on the chain (calls/step)  kernel"]
    for name, us in sorted(chain.items(), key=lambda kv: -kv[1])[:top]:
        calls, from_start = totals[name]
        out.append(f"  {from_start / steps:9.2f} {us / steps:9.2f} ({calls / steps:5.1f})  {name}")
    return out


def summarize_whole(rows, top, calls):
    """Every kernel of the timeline, per call: span, busy time and the totals by name."""
    span = (max(r[1] for r in rows) - rows[0][0]) / 1e3 / calls
    busy = busy_ns([(r[0], r[1]) for r in rows]) / 1e3 / calls
    out = [f"  per call ({calls}): span {span:.1f} us, kernels busy {busy:.1f} us, {len(rows) / calls:.1f} kernels",
           "  us/call (calls/call)  kernel"]
    totals = totals_by_name(rows)
    for name, (n, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"  {us / calls:9.1f} ({n / calls:6.1f})  {name}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", action="store_true", help="a greedy decoding run: per-step kernels")
    ap.add_argument("--steps", type=int, default=20, help="decoding steps summarised (--decode)")
    ap.add_argument("--whole", action="store_true", help="no training steps: every kernel, per --calls")
    ap.add_argument("--calls", type=int, default=1, help="op calls in the run (--whole): figures per call")
    ap.add_argument("dir")
    ap.add_argument("--top", type=int, default=25, help="compute kernels listed")
    ap.add_argument("--beside", type=int, default=6, help="compute kernels listed beside each NCCL kernel")
    a = ap.parse_args()
    if a.calls < 1:
        print(f"kernel_trace.py: --calls must be at least 1, got {a.calls}", file=sys.stderr)
        return 2
    files = sorted(f for f in glob.glob(os.path.join(a.dir, "trace.r*.csv")) if os.path.getsize(f) > 0)
    if not files:
        print(f"kernel_trace.py: no trace.r*.csv with kernels in {a.dir}", file=sys.stderr)
        return 2
    for f in files:
        print(f"== {os.path.basename(f)}")
        rows = load(f)
        if a.whole:
            lines = summarize_whole(rows, a.top, a.calls)
        elif a.decode:
            lines = summarize_decode(rows, a.top, a.steps)
        else:
            lines = summarize(rows, a.top, a.beside)
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
