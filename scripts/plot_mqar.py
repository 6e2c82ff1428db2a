#!/usr/bin/env python3
"""MQAR accuracy against recurrent-state size, one series per architecture (the Based paper's Figure 2).

  python3 scripts/plot_mqar.py RESULTS [RESULTS...] --out FILE.png|.svg [--slice L,P|pooled] [--title T]

RESULTS: a compare.json written by scripts/compare.sh (its MQAR rows), or a directory of MQAR run
directories (<mixer>_d<width>/ holding eval.json and info.json, e.g. OUT/mqar of compare.sh).
x: the decode state of one sequence in bytes (`linac info`'s decode_state_bytes.per_sequence, after
the longest test sequence), log scale; y: the accuracy on one test slice, --slice L,P (sequence
length L, P key-value pairs; default: the hardest slice present, the longest L, then the most pairs)
or over all test sequences (--slice pooled). Each series' points (one per width) are sorted by state
size. Needs matplotlib (Debian: apt-get install python3-matplotlib, then run with /usr/bin/python3).
Errors: one line on stderr, exit status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in scripts/
import compare_table  # noqa: E402  (the row format and slice helpers compare.sh's table uses)
import plot_common  # noqa: E402

PROG = "plot_mqar.py"
die, warn = plot_common.reporter(PROG)


def load(path):
    """The MQAR rows of a compare.json or of a directory of run directories."""
    if os.path.isdir(path):
        runs = sorted(os.path.join(path, n) for n in os.listdir(path)
                      if any(os.path.isfile(os.path.join(path, n, f)) for f in ("eval.json", "error.txt")))
        if not runs:
            die(f"{path}: no run directories holding eval.json")
        return [compare_table.run_row("mqar", d) for d in runs]
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        die(f"{path}: no such file or directory")
    except json.JSONDecodeError as e:
        die(f"{path}:{e.lineno}: malformed JSON ({e.msg})")
    if not isinstance(data, list):
        die(f"{path}: expected a list of rows (compare.json of scripts/compare.sh)")
    return [r for r in data if isinstance(r, dict) and r.get("kind") == "mqar"]


def parse_slice(text):
    if text == "pooled":
        return text
    try:
        seq_len, pairs = (int(v) for v in text.split(","))
    except ValueError:
        die(f"--slice {text}: expected L,P (two integers) or pooled")
    return seq_len, pairs


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", metavar="RESULTS", help="compare.json files or directories of MQAR runs")
    ap.add_argument("--out", required=True, help="output file, .png or .svg")
    ap.add_argument("--slice", help="L,P (sequence length, key-value pairs) or pooled; default: the hardest slice")
    ap.add_argument("--title", help="figure title (default: names the slice)")
    args = ap.parse_args()

    plot_common.check_out(args.out, die)
    want = parse_slice(args.slice) if args.slice else None
    rows = []
    for r in (r for path in args.results for r in load(path)):
        name = f"{r.get('arch')}" + (f" d{r['width']}" if r.get("width") else "")
        if "error" in r:
            warn(f"{name}: failed ({r['error']}); left out")
        elif r.get("decode_state_bytes_per_sequence") is None:
            warn(f"{name}: no decode state size (info.json without decode_state_bytes); left out")
        else:
            rows.append(r)
    if not rows:
        die(f"no MQAR results in {', '.join(args.results)}")
    if want is None:
        want = compare_table.hardest_slice(rows) or die("no row has MQAR slices; use --slice pooled")
    elif want != "pooled" and not any(compare_table.slice_accuracy(r, want) is not None for r in rows):
        present = sorted({compare_table.slice_key(s) for r in rows for s in r.get("mqar_slices", [])})
        die(f"--slice {args.slice}: no result has it (present: {' '.join(f'{L},{P}' for L, P in present)})")

    series = {}  # arch -> [(state bytes, accuracy, width)]
    for r in rows:
        acc = r["mqar_accuracy_pooled"] if want == "pooled" else compare_table.slice_accuracy(r, want)
        if acc is None:
            warn(f"{r['arch']} d{r['width']}: no slice seq_len {want[0]}, {want[1]} pairs; left out")
            continue
        series.setdefault(r["arch"], []).append((r["decode_state_bytes_per_sequence"], acc, r["width"]))

    plt = plot_common.pyplot(die)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arch in sorted(series, key=lambda a: compare_table.rank(compare_table.MQAR_ORDER, a)):
        points = sorted(series[arch])
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=arch)
        for x, y, width in points:
            ax.annotate(f"d{width}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, alpha=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("state size (bytes)")
    ax.set_ylabel("MQAR accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(args.title or ("MQAR, all test sequences" if want == "pooled"
                                else f"MQAR, sequence length {want[0]}, {want[1]} key-value pairs"))
    plot_common.save(fig, args.out, die)


if __name__ == "__main__":
    main()
