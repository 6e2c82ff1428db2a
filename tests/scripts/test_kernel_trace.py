#!/usr/bin/env python3
"""scripts/kernel_trace.py on a hand-made timeline: steps cut at the last of consecutive AdamW
kernels, the last step's compute, idle and NCCL time, the compute kernels beside each NCCL kernel,
totals by kernel name, and a directory without traces refused in one line with status 2; with
--decode, greedy decoding steps cut at each greedy_pick kernel: the last steps' mean span from
their first kernel to the pick, the kernels' busy time, the kernels per step and their time per
step by name, from their starts and on the chain (a kernel started before the one ahead ended,
as a dependent launch does, adds only what runs past that end); with --whole, a run without
training steps: its span, busy time and totals by kernel name per op call, and --calls below 1
refused.
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "kernel_trace.py")

GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
ATTN = "_ZN5linac4attn15bwd_sm90_kernelILi64ELb1EEEv14CUtensorMap_st"
ADAM = "_ZN5linac12adamw_kernelILb1EEEvPfPKf"
NCCL = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LLv"
PICK = "_ZN5linac47_GLOBAL__N__d7a87111_14_greedy_pick_cu_83d3b7b618greedy_pick_kernelEPKfiPiPd"


def us(t):
    return int(t * 1000)  # ns


def timeline():
    """Three steps of 1000 / 1100 / 1200 us: a GEMM, an attention kernel with NCCL beside it, two
    AdamW kernels back to back; kernel times in us from each step's start."""
    rows, t = [], 0
    for length in (1000, 1100, 1200):
        rows.append((t + 0, t + 300, 7, 132, GEMM))
        rows.append((t + 300, t + 700, 7, 3072, ATTN))
        rows.append((t + 350, t + 550, 20, 24, NCCL))
        rows.append((t + 750, t + length - 100, 7, 132, GEMM))  # 50 us idle before it
        rows.append((t + length - 100, t + length - 60, 7, 4096, ADAM))
        rows.append((t + length - 60, t + length, 7, 4096, ADAM))
        t += length
    return [(us(a), us(b), s, g, n) for a, b, s, g, n in rows]


def write_trace(path, rows):
    """rows of (start, end, stream, grid, name), times in ns, as kernel_trace.cpp writes them."""
    with open(path, "w") as f:
        for a, b, s, g, n in rows:
            f.write(f"{a},{b},0,{s},{g},{n}\n")


class KernelTrace(unittest.TestCase):
    def run_script(self, d, *args):
        return subprocess.run([sys.executable, SCRIPT, d, *args], capture_output=True, text=True, timeout=60)

    def test_steps_nccl_and_totals(self):
        with tempfile.TemporaryDirectory() as d:
            write_trace(os.path.join(d, "trace.r0.123.csv"), timeline())
            open(os.path.join(d, "trace.r0.99.csv"), "w").close()  # mpirun's own, empty: skipped
            r = self.run_script(d)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertEqual(lines[0], "== trace.r0.123.csv")
            self.assertEqual(lines[1], "steps (ms): 1.10, 1.20")
            self.assertEqual(lines[2], "last step: 1200 us, compute busy 1150, idle 50, 1 NCCL kernels for 200 us")
            self.assertEqual(lines[3].split(), ["+", "350", "us", "200", "us", "beside:", "bwd_sm90_kernel", "(400)"])
            self.assertEqual(lines[4], "compute kernels, us in the last step (calls):")
            totals = {m[3]: (int(m[1]), int(m[2])) for m in (re.match(r"\s*(\d+) \(\s*(\d+)\)\s+(\S+)", l) for l in lines[5:])}
            self.assertEqual(totals, {GEMM: (650, 2), "bwd_sm90_kernel": (400, 1), "adamw_kernel": (100, 2)})

    def test_decode_steps(self):
        # Five steps of 200 us: a GEMM (100 us), an attention kernel launched 40 us before the GEMM
        # ends (90 us from its start, 50 past the GEMM), 10 us idle, the pick (10); the next step
        # starts 30 us after the pick.
        rows, t = [], 0
        for _ in range(5):
            rows += [(t, t + 100, 7, 8, GEMM), (t + 60, t + 150, 7, 12, ATTN), (t + 160, t + 170, 7, 1, PICK)]
            t += 200
        with tempfile.TemporaryDirectory() as d:
            write_trace(os.path.join(d, "trace.r0.5.csv"), [(us(a), us(b), s, g, n) for a, b, s, g, n in rows])
            r = self.run_script(d, "--decode", "--steps", "3")
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertEqual(lines[1], "  3 steps: 170.0 us per step from its first kernel to its pick, kernels busy "
                                       "160.0 us, 3.0 kernels per step")
            per_step = {m[4]: (float(m[1]), float(m[2]), float(m[3]))
                        for m in (re.match(r"\s*([\d.]+)\s+([\d.]+) \(\s*([\d.]+)\)\s+(\S+)", l) for l in lines[3:])}
            self.assertEqual(per_step, {GEMM: (100.0, 100.0, 1.0), "bwd_sm90_kernel": (90.0, 50.0, 1.0),
                                        "greedy_pick_kernel": (10.0, 10.0, 1.0)})
            r = self.run_script(d, "--decode", "--steps", "5")
            self.assertIn("only 5 decoding steps", r.stdout)

    def test_whole_timeline_per_call(self):
        # Two op calls of a GEMM (100 us) and an attention kernel (50 us) 25 us after it, the second
        # call 100 us after the first ends: 450 us from the first start to the last end, 300 busy.
        rows = [(0, 100, 7, 8, GEMM), (125, 175, 7, 12, ATTN), (275, 375, 7, 8, GEMM), (400, 450, 7, 12, ATTN)]
        with tempfile.TemporaryDirectory() as d:
            write_trace(os.path.join(d, "trace.r0.7.csv"), [(us(a), us(b), s, g, n) for a, b, s, g, n in rows])
            r = self.run_script(d, "--whole", "--calls", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertEqual(lines[1], "  per call (2): span 225.0 us, kernels busy 150.0 us, 2.0 kernels")
            per_call = {m[3]: (float(m[1]), float(m[2]))
                        for m in (re.match(r"\s*([\d.]+) \(\s*([\d.]+)\)\s+(\S+)", l) for l in lines[3:])}
            self.assertEqual(per_call, {GEMM: (100.0, 1.0), "bwd_sm90_kernel": (50.0, 1.0)})
            r = self.run_script(d, "--whole", "--calls", "0")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--calls", r.stderr)

    def test_no_traces_is_one_line_and_status_2(self):
        with tempfile.TemporaryDirectory() as d:
            r = self.run_script(d)
            self.assertEqual(r.returncode, 2)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1)
            self.assertIn(d, r.stderr)


if __name__ == "__main__":
    unittest.main()
