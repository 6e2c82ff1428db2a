#!/usr/bin/env python3
"""Collects the per-run results of scripts/compare.sh into OUT_DIR/compare.json and OUT_DIR/compare.md.

  python3 scripts/compare_table.py OUT_DIR [--keep EARLIER_compare.json]

Reads OUT_DIR/lm/<arch>/ (info.json from `linac info --json`, eval.json from `linac eval --json`,
bench.json from `linac bench --json`) and OUT_DIR/mqar/<mixer>_d<width>/ (info.json, eval.json
with its "mqar" object). A run directory holding error.txt failed; its row carries "error" with
that text, and so does a run whose files are missing or lack a field. compare.json is a list of
rows ("kind": "lm" or "mqar"); compare.md has one Markdown table per kind. scripts/plot_mqar.py
reads MQAR run directories through run_row(). --keep adds the rows of an earlier compare.json
that OUT_DIR has no run for (same kind, arch and width), so a comparison can be extended one
architecture at a time. Errors: one line on stderr, exit status 2.
"""
import argparse
import json
import os
import re
import sys

LM_ORDER = ["transformer", "gla", "based", "transnormer", "latte", "latte_macchiato", "transformer_vq"]
MQAR_ORDER = ["attention", "sliding_window", "based", "gla", "transnormer", "latte", "latte_macchiato", "transformer_vq"]


class RunError(Exception):
    pass


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise RunError(f"no {os.path.basename(path)}") from None
    except json.JSONDecodeError as e:
        raise RunError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None


def get(obj, path, *keys):
    """obj[k0][k1]...; a RunError naming the file and the key when one is missing."""
    for k in keys:
        try:
            obj = obj[k]
        except (KeyError, IndexError, TypeError):
            raise RunError(f"{path}: no {'.'.join(map(str, keys))}") from None
    return obj


def model_fields(run_dir):
    path = os.path.join(run_dir, "info.json")
    info = read_json(path)
    row = {"config": get(info, path, "config"), "params": get(info, path, "params"),
           "non_embedding_params": get(info, path, "non_embedding_params"),
           "decode_state_bytes_per_sequence": None, "decode_state_at_seq_len": None,
           "decode_state_bytes_per_token_of_context": None}
    if "decode_state_bytes" in info:
        per_seq = get(info, path, "decode_state_bytes", "per_sequence")
        at = get(info, path, "decode_state_bytes", "at_seq_len")
        row.update(decode_state_bytes_per_sequence=per_seq, decode_state_at_seq_len=at,
                   decode_state_bytes_per_token_of_context=per_seq / at)
    return row


def lm_row(run_dir):
    row = model_fields(run_dir)
    path = os.path.join(run_dir, "eval.json")
    ev = read_json(path)
    row.update(val_loss=get(ev, path, "loss"), val_ppl=get(ev, path, "perplexity"), val_tokens=get(ev, path, "tokens"))
    path = os.path.join(run_dir, "bench.json")
    bench = read_json(path)
    row.update(tokens_per_s=get(bench, path, "rows", 0, "tokens_per_s"),
               peak_memory_bytes=get(bench, path, "rows", 0, "peak_bytes"), bench_seq_len=get(bench, path, "rows", 0, "seq_len"))
    return row


def mqar_row(run_dir):
    row = model_fields(run_dir)
    path = os.path.join(run_dir, "eval.json")
    ev = read_json(path)
    slices = get(ev, path, "mqar", "slices")
    for i in range(len(slices)):
        for k in ("seq_len", "pairs", "accuracy"):
            get(ev, path, "mqar", "slices", i, k)
    row.update(mqar_accuracy_pooled=get(ev, path, "mqar", "accuracy"), mqar_loss=get(ev, path, "mqar", "loss"),
               mqar_slices=slices)
    return row


def run_row(kind, run_dir):
    """The row of one run directory; {"error": ...} in it when the run failed."""
    name = os.path.basename(os.path.normpath(run_dir))
    row = {"kind": kind, "arch": name, "run_dir": run_dir}
    if kind == "mqar":  # <mixer>_d<width>
        m = re.fullmatch(r"(.+)_d(\d+)", name)
        row.update(arch=m.group(1) if m else name, width=int(m.group(2)) if m else None)
    err = os.path.join(run_dir, "error.txt")
    if os.path.isfile(err):
        with open(err, encoding="utf-8", errors="replace") as f:
            row["error"] = f.read().strip() or "unknown error"
        return row
    try:
        row.update(lm_row(run_dir) if kind == "lm" else mqar_row(run_dir))
    except RunError as e:
        row["error"] = str(e)
    return row


def slice_key(s):
    return (s["seq_len"], s["pairs"])


def slice_accuracy(row, key):
    """The row's accuracy on the slice (seq_len, pairs), or None."""
    return next((s["accuracy"] for s in row.get("mqar_slices", []) if slice_key(s) == key), None)


def hardest_slice(rows):
    """(seq_len, pairs) of the hardest slice any row has: largest seq_len, then largest pairs."""
    return max((slice_key(s) for r in rows for s in r.get("mqar_slices", [])), default=None)


def rank(names, name):
    """Sort key: the position in names, then the name (names not listed come last)."""
    return (names.index(name) if name in names else len(names), name)


def human(n, units, base):
    for u in units[:-1]:
        if abs(n) < base:
            return f"{n:.4g} {u}".rstrip()
        n /= base
    return f"{n:.4g} {units[-1]}"


def size(n):
    return "—" if n is None else human(n, ["B", "KiB", "MiB", "GiB", "TiB"], 1024)


def count(n):
    return human(n, ["", "K", "M", "B"], 1000).replace(" ", "")


def state(r):
    if r["decode_state_bytes_per_sequence"] is None:
        return "—"
    return f"{size(r['decode_state_bytes_per_sequence'])} at T={r['decode_state_at_seq_len']}"


def table(header, rows, cells):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if "error" in r:
            body = [r["arch"] + (f" d{r['width']}" if r.get("width") else ""),
                    "failed: " + r["error"].replace("|", "\\|").replace("\n", " ")] + [""] * (len(header) - 2)
        else:
            body = cells(r)
        lines.append("| " + " | ".join(body) + " |")
    return lines


def markdown(lm, mqar, hardest):
    md = []
    if lm:
        md += ["## Language modelling", "",
               "Validation loss over the whole val split (`linac eval`); tokens/s and peak memory from `linac bench` "
               "at the config's seq_len; decode state: all token mixers' state for one sequence after T tokens "
               "(`linac info`), also divided by T.", ""]
        md += table(["arch", "non-embedding params", "val loss", "val ppl", "tokens/s", "peak memory",
                     "decode state", "state / context token"], lm,
                    lambda r: [r["arch"], count(r["non_embedding_params"]), f"{r['val_loss']:.4f}", f"{r['val_ppl']:.2f}",
                               f"{r['tokens_per_s']:,.0f}", size(r["peak_memory_bytes"]), state(r),
                               size(r["decode_state_bytes_per_token_of_context"])])
        md.append("")
    if mqar:
        at = f"seq_len {hardest[0]}, {hardest[1]} pairs" if hardest else "no slice"
        md += ["## MQAR", "", f"Accuracy on the hardest slice ({at}) and over all test sequences (pooled).", ""]
        md += table(["mixer", "width", "non-embedding params", f"accuracy ({at})", "pooled accuracy", "state"], mqar,
                    lambda r: [r["arch"], str(r["width"]), count(r["non_embedding_params"]),
                               "—" if r["mqar_accuracy_hardest"] is None else f"{100 * r['mqar_accuracy_hardest']:.1f}%",
                               f"{100 * r['mqar_accuracy_pooled']:.1f}%", state(r)])
        md.append("")
    return "\n".join(md)


def runs(out_dir, kind):
    d = os.path.join(out_dir, kind)
    return sorted(os.path.join(d, n) for n in os.listdir(d) if os.path.isdir(os.path.join(d, n))) if os.path.isdir(d) else []


def row_id(r):
    return (r.get("kind"), r.get("arch"), r.get("width"))


def kept_rows(path, fresh):
    """The rows of an earlier compare.json whose (kind, arch, width) is not among the fresh rows."""
    try:
        rows = read_json(path)
    except RunError as e:
        raise RunError(f"--keep {path}: {e}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and r.get("kind") in ("lm", "mqar") and "arch" in r
                                             for r in rows):
        raise RunError(f"--keep {path}: expected a list of rows with \"kind\" (lm or mqar) and \"arch\"")
    have = {row_id(r) for r in fresh}
    return [r for r in rows if row_id(r) not in have]


def main():
    ap = argparse.ArgumentParser(prog="compare_table.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", metavar="OUT_DIR", help="the --out directory of scripts/compare.sh")
    ap.add_argument("--keep", metavar="FILE", help="an earlier compare.json whose other rows are kept")
    args = ap.parse_args()
    out_dir = args.out_dir
    lm = [run_row("lm", d) for d in runs(out_dir, "lm")]
    mqar = [run_row("mqar", d) for d in runs(out_dir, "mqar")]
    if args.keep:
        try:
            old = kept_rows(args.keep, lm + mqar)
        except RunError as e:
            print(f"compare_table.py: error: {e}", file=sys.stderr)
            sys.exit(2)
        lm += [r for r in old if r["kind"] == "lm"]
        mqar += [r for r in old if r["kind"] == "mqar"]
    lm.sort(key=lambda r: rank(LM_ORDER, r["arch"]))
    mqar.sort(key=lambda r: (rank(MQAR_ORDER, r["arch"]), r.get("width") or 0))
    if not lm and not mqar:
        print(f"compare_table.py: error: {out_dir}: no run directories under lm/ or mqar/", file=sys.stderr)
        sys.exit(2)
    hardest = hardest_slice(r for r in mqar if "error" not in r)
    for r in mqar:
        if "error" not in r:
            r["mqar_hardest_slice"] = {"seq_len": hardest[0], "pairs": hardest[1]} if hardest else None
            r["mqar_accuracy_hardest"] = slice_accuracy(r, hardest)
    with open(os.path.join(out_dir, "compare.json"), "w", encoding="utf-8") as f:
        json.dump(lm + mqar, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "compare.md"), "w", encoding="utf-8") as f:
        f.write(markdown(lm, mqar, hardest))
    print(f"wrote {os.path.join(out_dir, 'compare.json')} and compare.md ({len(lm)} LM rows, {len(mqar)} MQAR rows)")


if __name__ == "__main__":
    main()
