#!/usr/bin/env python3
"""The instruction mix of kernels in a `cuobjdump -sass` listing: per kernel its instruction count,
then each loop (the span from a backward branch's target to the branch) with its length and its
most frequent opcodes (guard predicates and modifiers dropped: `@!P0 LDS.U16` counts as LDS).
A loop's length is what one trip issues at most (both sides of a branch inside it are counted),
so it bounds, with the trip count, how many instructions a warp spends there: the figure to set
next to Nsight Compute's executed instructions when a kernel is issue-bound.

    scripts/sass_mix.py [--kernel REGEX] [--top N] LISTING
"""
import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def parse(text):
    """[(mangled name, [(address, instruction text)])] in listing order."""
    kernels = []
    for line in text.splitlines():
        if "Function :" in line:
            kernels.append((line.split("Function :", 1)[1].strip(), []))
        elif kernels:
            m = INSTR.search(line)
            if m:
                kernels[-1][1].append((int(m.group(1), 16), m.group(2)))
    return kernels


def mix(instrs, top):
    return ", ".join("%s %d" % kv for kv in Counter(opcode(t) for _, t in instrs).most_common(top))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="", help="only kernels whose (demangled) name matches this regex")
    ap.add_argument("--top", type=int, default=8, help="opcodes listed per kernel and loop")
    ap.add_argument("listing")
    args = ap.parse_args()
    try:
        pattern = re.compile(args.kernel)
    except re.error as e:
        print("sass_mix.py: --kernel is not a regular expression (%s)" % e, file=sys.stderr)
        sys.exit(2)
    try:
        with open(args.listing) as f:
            kernels = parse(f.read())
    except OSError as e:
        print("sass_mix.py: cannot read %s (%s)" % (args.listing, e.strerror), file=sys.stderr)
        sys.exit(2)
    names = demangle([k[0] for k in kernels])
    for name, (_, instrs) in zip(names, kernels):
        if not pattern.search(name):
            continue
        print("%s: %d instructions (%s)" % (name[:140], len(instrs), mix(instrs, args.top)))
        for addr, text in instrs:
            m = BRANCH.search(text)
            if m and int(m.group(1), 16) <= addr:
                start = int(m.group(1), 16)
                body = [(a, t) for a, t in instrs if start <= a <= addr]
                print("  loop 0x%x-0x%x: %d instructions (%s)" % (start, addr, len(body), mix(body, args.top)))


if __name__ == "__main__":
    main()
