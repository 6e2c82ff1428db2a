#!/usr/bin/env python3
"""Validation loss of several linac runs against tokens seen and against wall-clock time.

  python3 scripts/plot_runs.py RUN_DIR [RUN_DIR...] --out FILE.png|.svg
                               [--labels a,b,...] [--title T] [--train-loss] [--metric M]

Reads each RUN_DIR/metrics.jsonl and draws one figure with two panels: validation loss against
tokens seen (left) and against wall-clock time (right); --train-loss adds the training loss,
faintly. --metric picks another validation metric of metrics.jsonl: val_ppl, or val_accuracy for
MQAR runs (default val_loss). A resumed run appends to the same file (having dropped the records of the steps it
runs again) and its `time_s` starts again from zero: time is made cumulative across such restarts; a step logged
twice (a file from before resumes dropped those records) keeps its last record in the token panel. Needs matplotlib (Debian: apt-get install python3-matplotlib,
then run with /usr/bin/python3). Errors: one line on stderr, exit status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in scripts/
import plot_common  # noqa: E402

PROG = "plot_runs.py"
die, warn = plot_common.reporter(PROG)


def read_jsonl(path):
    """The records of a metrics.jsonl file, skipped steps left out."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{path}:{n}: malformed JSON line ({e.msg})")
            if not isinstance(rec, dict):
                die(f"{path}:{n}: a metrics line must be a JSON object")
            if not rec.get("skipped"):
                records.append(rec)
    return records


METRIC_LABELS = {"val_loss": "validation loss (nats/token)", "val_ppl": "validation perplexity",
                 "val_accuracy": "validation accuracy (MQAR)"}


def load_run(run_dir, metric="val_loss"):
    """{'val'|'train': {'tokens': [(tokens, value)], 'time': [(seconds, value)]}} of one run: the
    validation `metric` and the training loss."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isdir(run_dir):
        die(f"{run_dir}: no such run directory")
    if not os.path.isfile(path):
        die(f"{run_dir}: no metrics.jsonl")
    records = read_jsonl(path)
    if not any(metric in r for r in records):
        die(f"{path}: no {metric} record")
    by_step = {"val": {}, "train": {}}  # step -> (tokens, loss): a redone step keeps its last record
    timed = {"val": [], "train": []}
    offset = last_time = 0.0
    tokens_at = {}  # step -> tokens_seen, for val lines that lack it
    for r in records:
        step = r.get("step")
        if "time_s" in r:
            if r["time_s"] < last_time:  # a resumed process: its clock starts again
                offset += last_time
            last_time = r["time_s"]
        if "tokens_seen" in r:
            tokens_at[step] = r["tokens_seen"]
        for kind, key in (("val", metric), ("train", "loss")):
            if r.get(key) is None:
                continue
            if step in tokens_at:
                by_step[kind][step] = (tokens_at[step], r[key])
            if "time_s" in r:
                timed[kind].append((offset + r["time_s"], r[key]))
    return {kind: {"tokens": [by_step[kind][s] for s in sorted(by_step[kind])], "time": timed[kind]}
            for kind in by_step}


def time_unit(seconds):
    if seconds > 2 * 3600:
        return 3600.0, "h"
    if seconds > 120:
        return 60.0, "min"
    return 1.0, "s"


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.jsonl")
    ap.add_argument("--out", required=True, help="output file, .png or .svg")
    ap.add_argument("--labels", help="comma-separated legend labels, one per run (default: the directory names)")
    ap.add_argument("--title", help="figure title")
    ap.add_argument("--train-loss", action="store_true", help="also draw the training loss, faintly")
    ap.add_argument("--metric", default="val_loss", choices=sorted(METRIC_LABELS),
                    help="the validation metric to draw (val_accuracy: MQAR runs)")
    args = ap.parse_args()

    plot_common.check_out(args.out, die)
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(d)) for d in args.runs]
    if len(labels) != len(args.runs):
        die(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    if args.train_loss and args.metric != "val_loss":
        die(f"--train-loss draws losses: it goes with --metric val_loss, not {args.metric}")
    runs = [load_run(d, args.metric) for d in args.runs]
    for label, run in zip(labels, runs):
        if not run["val"]["tokens"]:
            warn(f"{label}: no {args.metric} record has tokens_seen; left out of the tokens panel")
        if not run["val"]["time"]:
            warn(f"{label}: no {args.metric} record has time_s; left out of the wall-clock panel")

    plt = plot_common.pyplot(die)

    max_time = max((t for run in runs for t, _ in run["val"]["time"] + run["train"]["time"]), default=0.0)
    scale, unit = time_unit(max_time)
    fig, (ax_tok, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, (label, run) in enumerate(zip(labels, runs)):
        color = f"C{i % 10}"
        for ax, panel, div in ((ax_tok, "tokens", 1e6), (ax_time, "time", scale)):
            if args.train_loss and run["train"][panel]:
                x, y = zip(*run["train"][panel])
                ax.plot([v / div for v in x], y, color=color, alpha=0.25, linewidth=0.8)
            if run["val"][panel]:
                x, y = zip(*run["val"][panel])
                ax.plot([v / div for v in x], y, color=color, marker="o", markersize=3, label=label)
    if args.train_loss:
        ax_tok.plot([], [], color="grey", alpha=0.4, linewidth=0.8, label="training loss (faint)")
    ax_tok.set_xlabel("tokens seen (millions)")
    ax_time.set_xlabel(f"wall-clock time ({unit})")
    ax_tok.set_ylabel(METRIC_LABELS[args.metric])
    legend = {}  # one legend for both panels: a run may have points in only one of them
    for ax in (ax_tok, ax_time):
        ax.grid(True, alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    ax_tok.legend(legend.values(), legend.keys())
    if args.title:
        fig.suptitle(args.title)
    plot_common.save(fig, args.out, die)


if __name__ == "__main__":
    main()
