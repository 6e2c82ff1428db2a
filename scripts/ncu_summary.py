#!/usr/bin/env python3
"""One line per kernel launch of an `ncu --csv --page details` report: duration, the SM, L2 and
DRAM throughputs (% of peak), the SM clock (GHz), the tensor pipe's active cycles (% of the elapsed
ones, where the report was taken with `--metrics
sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed`), grid and cluster size, achieved
warps per SM and registers per thread (where the report has the Occupancy and LaunchStats
sections), warp instructions issued per scheduler and cycle and millions executed (SchedulerStats,
InstructionStats), and the kernel's name, shortened."""
import csv
import sys
from collections import OrderedDict

WANT = OrderedDict([
    ("Duration", "us"),
    ("Compute (SM) Throughput", "SM%"),
    ("L2 Cache Throughput", "L2%"),
    ("DRAM Throughput", "DRAM%"),
    ("SM Frequency", "GHz"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "tensor%"),
    ("Grid Size", "grid"),
    ("Cluster Size", "cluster"),
    ("Achieved Active Warps Per SM", "warps"),
    ("Registers Per Thread", "regs"),
    ("Issued Warp Per Scheduler", "issue"),
    ("Executed Instructions", "Minst"),
])
# Column format by position: the duration, three percentages, the clock, a percentage, then grid,
# cluster, warps, regs, the issue rate and the instructions.
FORMATS = ["%9.1f", "%6.1f", "%6.1f", "%6.1f", "%5.2f", "%7.1f", "%7d", "%7d", "%6.1f", "%5d", "%5.2f", "%7.1f"]


def main(path):
    launches = OrderedDict()
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = None
    for r in rows:
        if "Kernel Name" in r and "Metric Name" in r:
            header = {name: i for i, name in enumerate(r)}
            continue
        if header is None or len(r) <= header["Metric Value"]:  # trailing empty fields may be left out
            continue
        key = r[header["ID"]]
        entry = launches.setdefault(key, {"name": r[header["Kernel Name"]]})
        metric, unit, value = r[header["Metric Name"]], r[header["Metric Unit"]], r[header["Metric Value"]]
        if metric in WANT:
            try:
                v = float(value.replace(",", "").split()[0])
            except ValueError:
                continue
            if metric == "Duration":
                v *= {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}.get(unit, 1.0)
            elif metric == "SM Frequency":  # cycle/nsecond is GHz
                scale = {"hz": 1e-9, "khz": 1e-6, "mhz": 1e-3, "cycle/usecond": 1e-3, "cycle/second": 1e-9}
                v *= scale.get(unit.lower(), 1.0)
            elif metric == "Executed Instructions":
                v *= 1e-6
            entry[metric] = v
    widths = [len(fmt % 0) for fmt in FORMATS]
    print("%5s %s  %s" % ("id", " ".join("%*s" % (w, n) for w, n in zip(widths, WANT.values())), "kernel"))
    for key, e in launches.items():
        cells = [fmt % e[m] if e.get(m) is not None else "%*s" % (w, "-")
                 for fmt, w, m in zip(FORMATS, widths, WANT)]
        print("%5s %s  %s" % (key, " ".join(cells), e["name"][:110]))


if __name__ == "__main__":
    main(sys.argv[1])
