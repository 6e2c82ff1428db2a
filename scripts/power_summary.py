#!/usr/bin/env python3
"""Whether a run held the GPU at its power limit: reads `nvidia-smi --query-gpu=... --format=csv,nounits
-lms N` samples (a header line naming the fields, repeated headers skipped) and prints, over the
samples under load (drawing at least half the power limit, which leaves out the program's start and
end), how many there were, the median power draw against the limit, the share of samples within 5%
of it or with the software power cap active, and the SM clock's median and 10th / 90th percentiles.

    scripts/power_summary.py SAMPLES.csv

Samples it cannot summarise (no file, no header with those fields, none under load) get one line
and exit status 2.
"""
import csv
import statistics
import sys


def number(text):
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(path):
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if r]
    except OSError as e:
        print("power: cannot read %s: %s" % (path, e.strerror))
        return 2
    if not rows:
        print("power: no samples in %s" % path)
        return 2
    header = [h.strip().split(" [")[0] for h in rows[0]]
    # nvidia-smi answers the query field clocks.sm under the name clocks.current.sm.
    col = {("clocks.sm" if name == "clocks.current.sm" else name): i for i, name in enumerate(header)}
    for need in ("power.draw", "power.limit", "clocks.sm"):
        if need not in col:
            print("power: the samples have no %s column (header: %s)" % (need, ", ".join(header)))
            return 2
    cap = col.get("clocks_event_reasons.sw_power_cap")
    loaded = []
    for r in rows[1:]:
        if r[0].strip().startswith(header[0]) or len(r) < len(header):
            continue  # a repeated header or a cut-off last line
        draw, limit, clock = (number(r[col[k]]) for k in ("power.draw", "power.limit", "clocks.sm"))
        if None in (draw, limit, clock) or draw < 0.5 * limit:
            continue
        capped = cap is not None and r[cap].strip().lower() == "active"
        loaded.append((draw, limit, clock, capped))
    if not loaded:
        print("power: no sample under load (none drew half the power limit)")
        return 2
    draws = [s[0] for s in loaded]
    limit = statistics.median(s[1] for s in loaded)
    clocks = [s[2] for s in loaded]
    near = sum(1 for s in loaded if s[0] >= 0.95 * s[1]) / len(loaded)
    line = ("power: %d samples under load, draw %.0f W of %.0f W (median), %.0f%% within 5%% of the limit"
            % (len(loaded), statistics.median(draws), limit, 100 * near))
    if cap is not None:
        line += ", power cap active in %.0f%%" % (100 * sum(1 for s in loaded if s[3]) / len(loaded))
    line += "; SM clock %.0f MHz (median; p10 %.0f, p90 %.0f)" % (
        statistics.median(clocks), percentile(clocks, 0.1), percentile(clocks, 0.9))
    print(line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: scripts/power_summary.py SAMPLES.csv")
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
