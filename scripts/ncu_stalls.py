#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's per-instruction samples
(`ncu ... --section WarpStateStats --section SourceCounters -o REP`, then
`ncu -i REP.ncu-rep --csv --page source --print-source sass > FILE`).

Per kernel in FILE: the share of the warp-state samples by stall reason, the samples of each
mbarrier wait (a SYNCS.PHASECHK try-wait and the branch that retries it, keyed by the immediate
offset of the barrier's address: the kernel's shared-memory layout says which barrier that is), and the
instructions holding the most samples.

  ncu_stalls.py FILE [--top N]
"""
import argparse
import csv
import re
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(path):
    """(name, header, rows) per kernel of the CSV."""
    name, header, rows = None, None, []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                if header is not None:
                    yield name, header, rows
                name, header, rows = r[1], None, []
            elif r[0] == "Address":
                header = {n: i for i, n in enumerate(r)}
            elif header is not None and len(r) >= len(header):
                rows.append(r)
    if header is not None:
        yield name, header, rows


def count(r, h, col):
    v = r[h[col]]
    return int(v) if v and v != "-" else 0


def report(name, h, rows, top):
    reasons = [c for c in h if c.startswith("stall_") and "Not Issued" not in c]
    total = Counter()
    for r in rows:
        for c in reasons:
            total[c] += count(r, h, c)
    n = sum(total.values())
    print(f"== {name[:150]}")
    print(f"   {n} samples")
    if n == 0:
        return
    for c, v in total.most_common(8):
        print(f"   {c[6:]:18s} {100 * v / n:5.1f}%")

    # mbarrier waits: a try-wait's own samples and those of the branch that retries it
    short = [r[h["Address"]][-5:] for r in rows]
    at = {a: i for i, a in enumerate(short)}
    barrier = {}
    for i, r in enumerate(rows):
        m = re.search(r"SYNCS\.PHASECHK\S*\s+\S+,\s*(\[[^\]]+\])", r[h["Source"]])
        if m:  # keyed by the immediate offset: a barrier indexed by a slot or stage shows its first one's
            off = re.search(r"\+\s*(0x[0-9a-fA-F]+)\]$", m.group(1))
            barrier[i] = f"+{off.group(1)}" if off else m.group(1)
    waits = Counter()
    for i, r in enumerate(rows):
        s = count(r, h, SAMPLES)
        if not s:
            continue
        src = r[h["Source"]]
        if i in barrier:
            waits[barrier[i]] += s
        elif "BRA" in src:
            target = src.split("BRA")[-1].strip()[-5:]
            j = at.get(target)
            for k in (i - 1, j, j + 1 if j is not None else None):
                if k is not None and k in barrier:
                    waits[barrier[k]] += s
                    break
    if waits:
        print("   mbarrier waits (address offset: share of all samples)")
        for b, v in waits.most_common(10):
            print(f"     {b:14s} {100 * v / n:5.1f}%")

    print(f"   top {top} instructions (share, the two largest reasons)")
    for r in sorted(rows, key=lambda r: -count(r, h, SAMPLES))[:top]:
        s = count(r, h, SAMPLES)
        why = sorted(((count(r, h, c), c[6:]) for c in reasons), reverse=True)[:2]
        why = ", ".join(f"{c} {v}" for v, c in why if v)
        print(f"     {r[h['Address']][-5:]} {100 * s / n:5.1f}%  {r[h['Source']].strip()[:64]:64s} {why}")


def die(msg):
    print(f"ncu_stalls.py: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    try:
        found = list(kernels(a.file))
    except OSError as e:
        die(f"cannot read {a.file}: {e.strerror}")
    if not found or not any(rows for _, _, rows in found):
        die(f"{a.file} has no source page (expected the output of `ncu -i REP --csv --page source "
            "--print-source sass` for a report with the SourceCounters section)")
    for name, h, rows in found:
        report(name, h, rows, a.top)


if __name__ == "__main__":
    main()
