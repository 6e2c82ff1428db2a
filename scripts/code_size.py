#!/usr/bin/env python3
"""How many bytes of machine code (SASS) each kernel of a CUDA translation unit takes, and which
source lines they come from. A kernel much larger than the SM's instruction caches shows
instruction-fetch stalls in Nsight Compute (`no_inst`, scripts/ncu_stalls.py); code unrolled
around a rarely taken branch is the usual cause (kernels/latte/NOTES.md).

  code_size.py --build DIR SOURCE.cu [--kernel REGEX] [--top N]
      compiles SOURCE.cu to a cubin with the flags of its object in the CMake build DIR (one
      real architecture: sm_90a where the object is built for it, else the first sm_XX it names)
  code_size.py FILE.cubin [--kernel REGEX] [--top N]
      a cubin built with -lineinfo
  code_size.py --build DIR SOURCE.cu --against REV [--kernel REGEX]
      whether each kernel compiles to the same machine code as in git revision REV of the source's
      repository (REV's tree is compiled with the same flags): a refactor of GPU code checked
      without a GPU. Per kernel "same", "differs" (how many of its instructions) or "only in" one
      side; exit status 0 when every kernel is the same, 1 otherwise

Per kernel (largest first): its bytes, then the source lines holding the most of them. Inlined
code counts at its innermost line (a helper's line, not its caller's). Needs binutils' readelf,
objdump and c++filt; no CUDA disassembler.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter


def die(msg):
    print(f"code_size.py: {msg}", file=sys.stderr)
    sys.exit(2)


def run(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        die(f"{cmd[0]} is not installed")
    if r.returncode != 0:
        die(f"{cmd[0]} failed: {(r.stderr.strip().splitlines() or ['no message'])[-1]}")
    return r.stdout


def compile_cubin(build, source, out, root_map=None):
    """SOURCE's nvcc command from the build's ninja rules, made to write a cubin for one arch;
    root_map = (old, new) compiles the same command with every path under old moved to new."""
    source = os.path.abspath(source)
    targets = run(["ninja", "-C", build, "-t", "targets", "all"])
    objs = [t.split(":")[0] for t in targets.splitlines() if t.split(":")[0].endswith(".cu.o")]
    for obj in objs:  # the object whose command compiles this source
        if not obj.endswith(os.path.basename(source) + ".o"):
            continue
        cmd = run(["ninja", "-C", build, "-t", "commands", obj]).strip().splitlines()[-1]
        if source not in cmd:
            continue
        args = shlex.split(cmd)
        arch = "sm_90a" if "sm_90a" in cmd else (re.findall(r"sm_\d+a?", cmd) or ["sm_90"])[0]
        keep, skip = [], False  # skip: the argument after -MT, -MF or -o
        for a in args:
            if skip or a == "-MD" or a.startswith(("--generate-code", "-gencode", "-arch")):
                skip = False
                continue
            skip = a in ("-MT", "-MF", "-o")
            if not skip:
                keep.append("-cubin" if a == "-c" else a)
        keep += [f"-arch={arch}", "-o", out]
        if root_map:
            keep = [a.replace(root_map[0] + "/", root_map[1] + "/") for a in keep]
        try:
            r = subprocess.run(keep, cwd=build, capture_output=True, text=True)
        except FileNotFoundError:
            die(f"{keep[0]} is not installed")
        if r.returncode != 0:
            die(f"nvcc failed on {source}: {(r.stderr.strip().splitlines() or ['no message'])[-1]}")
        return
    die(f"no object in {build} compiles {source} (a .cu file of the build?)")


def text_sections(cubin):
    """(mangled kernel name, bytes, file offset) per .text section, in section order."""
    try:
        r = subprocess.run(["readelf", "-S", "-W", cubin], capture_output=True, text=True)
    except FileNotFoundError:
        die("readelf is not installed (binutils)")
    if r.returncode != 0:
        die(f"{cubin} is not a cubin (readelf cannot read it as ELF)")
    out = []
    for line in r.stdout.splitlines():
        m = re.search(r"\]\s+\.text\.(\S+)\s+PROGBITS\s+\S+\s+([0-9a-fA-F]+)\s+([0-9a-fA-F]+)", line)
        if m:
            out.append((m.group(1), int(m.group(3), 16), int(m.group(2), 16)))
    return out


def kernel_code(cubin):
    """{demangled kernel name: its machine code}."""
    sections = text_sections(cubin)
    with open(cubin, "rb") as f:
        data = f.read()
    names = demangle([n for n, _, _ in sections])
    return {name: data[off:off + size] for (_, size, off), name in zip(sections, names)}


def compare_with_revision(build, source, rev, kernel_filter, tmp):
    """Prints each kernel's machine code against REV's; returns whether every kernel is the same."""
    source = os.path.abspath(source)
    root = run(["git", "-C", os.path.dirname(source), "rev-parse", "--show-toplevel"]).strip()
    base = os.path.join(tmp, "base")
    os.makedirs(base)
    archive = subprocess.run(["git", "-C", root, "archive", rev], capture_output=True)
    if archive.returncode != 0:
        die(f"git archive {rev} failed: {(archive.stderr.decode().strip().splitlines() or ['no message'])[-1]}")
    subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
    if not os.path.isfile(os.path.join(base, os.path.relpath(source, root))):
        die(f"{os.path.relpath(source, root)} is not in {rev}")
    compile_cubin(build, source, os.path.join(tmp, "new.cubin"))
    compile_cubin(build, source, os.path.join(tmp, "old.cubin"), root_map=(root, base))
    new, old = kernel_code(os.path.join(tmp, "new.cubin")), kernel_code(os.path.join(tmp, "old.cubin"))
    names = [n for n in list(old) + [n for n in new if n not in old] if not kernel_filter or re.search(kernel_filter, n)]
    if not names:
        die(f"no kernel of {source} matches '{kernel_filter}'")
    same = 0
    for name in names:
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            print(f"only {'here' if a is None else 'in ' + rev:<10} {name[:140]}")
        elif a == b:
            same += 1
            print(f"same       {len(b):9d} bytes  {name[:140]}")
        else:  # 16-byte instructions (sm_70 and later)
            n = min(len(a), len(b)) // 16
            diff = sum(a[16 * i:16 * i + 16] != b[16 * i:16 * i + 16] for i in range(n))
            print(f"differs    {len(a)} -> {len(b)} bytes, {diff} of {n} instructions differ  {name[:140]}")
    print(f"{same} of {len(names)} kernels compile to the same machine code as in {rev}")
    return same == len(names)


def line_sequences(cubin):
    """(end address, [(address, file, line), ...]) per function, from the DWARF line table: each
    function's addresses start at 0 and its sequence ends at its size (a line "-")."""
    seqs, cur, path = [], [], None
    for line in run(["objdump", "--dwarf=decodedline", cubin]).splitlines():
        if line.endswith(":") and "/" in line and not line.startswith(" "):
            path = line[:-1]
            continue
        p = line.split()
        if len(p) < 3 or not (p[1].isdigit() or p[1] == "-"):
            continue
        try:
            addr = int(p[2], 0)
        except ValueError:
            continue
        if p[1] == "-":
            seqs.append((addr, cur))
            cur = []
        else:
            cur.append((addr, path or p[0], int(p[1])))
    return seqs


def demangle(names):
    if not names:
        return []
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines() if r.returncode == 0 else []
    return out if len(out) == len(names) else list(names)


def short_path(path):
    for root in ("/kernels/", "/base/", "/src/"):
        i = path.rfind(root)
        if i >= 0:
            return path[i + 1:]
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="a .cubin, or a .cu file of the build given by --build")
    p.add_argument("--build", help="CMake build directory (Ninja) whose flags compile the .cu file")
    p.add_argument("--kernel", help="only kernels whose demangled name matches this regular expression")
    p.add_argument("--top", type=int, default=10, help="source lines per kernel (default 10)")
    p.add_argument("--against", metavar="REV", help="compare each kernel's machine code with git revision REV's")
    a = p.parse_args()
    if not os.path.isfile(a.input):
        die(f"cannot read {a.input}")
    with tempfile.TemporaryDirectory() as tmp:
        if a.against:
            if not (a.input.endswith(".cu") and a.build):
                die("--against compares a .cu file of the build given by --build")
            sys.exit(0 if compare_with_revision(a.build, a.input, a.against, a.kernel, tmp) else 1)
        cubin = a.input
        if a.input.endswith(".cu"):
            if not a.build:
                die(f"{a.input} is a source file: --build DIR names the build whose flags compile it")
            cubin = os.path.join(tmp, "unit.cubin")
            compile_cubin(a.build, a.input, cubin)
        sections = text_sections(cubin)
        if not sections:
            die(f"{cubin} has no kernels (expected a cubin: nvcc -cubin)")
        seqs = line_sequences(cubin)
        names = demangle([n for n, _, _ in sections])
        rows, unmatched = [], 0
        for (_, size, _), name in zip(sections, names):
            # a function's sequence ends at its size; functions of one size take theirs in order
            i = next((i for i, (end, _) in enumerate(seqs) if end == size), None)
            seq = sorted(seqs.pop(i)[1]) if i is not None else []
            unmatched += not seq
            if a.kernel and not re.search(a.kernel, name):
                continue
            lines = Counter()
            for (x, f, n), (y, _, _) in zip(seq, seq[1:] + [(size, None, 0)]):
                lines[(short_path(f), n)] += y - x
            rows.append((size, name, lines))
        if not rows:
            die(f"no kernel of {a.input} matches '{a.kernel}'")
        if unmatched:
            print(f"({unmatched} of {len(sections)} functions have no line table: build with -lineinfo)")
        for size, name, lines in sorted(rows, key=lambda r: -r[0]):
            print(f"{size:9d} bytes  {name[:140]}")
            for (f, n), b in lines.most_common(a.top):
                print(f"  {b:9d}  {100 * b / size:5.1f}%  {f}:{n}")


if __name__ == "__main__":
    main()
