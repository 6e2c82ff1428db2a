#!/usr/bin/env python3
"""scripts/ncu_summary.py on a hand-made `ncu --csv --page details` report: one line per launch in
report order, durations in us whatever unit ncu printed them in, thousands separators read, the
warps, registers, issue-rate and instruction columns where the report has them and '-' where it
does not, the lines before the header (ncu's own messages, the program's output) skipped.
"""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ncu_summary.py")

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name"')


def row(launch, kernel, section, metric, unit, value):
    return ('"%d","1","linac","host","%s","1","13","(128, 1, 1)","(64, 32, 1)","0","9.0","%s","%s","%s","%s",'
            % (launch, kernel, section, metric, unit, value))


def report():
    lines = ["==PROF== Connected to process 1 (linac)", "some program output, 3 columns", HEADER]
    dqk = "void unnamed>::dqk_kernel<__nv_bfloat16>(const T1 *, Args)"
    lines += [row(0, dqk, "GPU Speed Of Light Throughput", "Duration", "ns", "396,928"),
              row(0, dqk, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "51.44"),
              row(0, dqk, "GPU Speed Of Light Throughput", "L2 Cache Throughput", "%", "52.18"),
              row(0, dqk, "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "34.68"),
              row(0, dqk, "Launch Statistics", "Grid Size", "", "4,096"),
              row(0, dqk, "Launch Statistics", "Cluster Size", "", "0"),
              row(0, dqk, "Launch Statistics", "Registers Per Thread", "register/thread", "122"),
              row(0, dqk, "Occupancy", "Achieved Active Warps Per SM", "warp", "15.67"),
              row(0, dqk, "Scheduler Statistics", "Issued Warp Per Scheduler", "", "0.62"),
              row(0, dqk, "Instruction Statistics", "Executed Instructions", "inst", "75,223,296")]
    gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"  # no Occupancy / LaunchStats sections
    lines += [row(1, gemm, "GPU Speed Of Light Throughput", "Duration", "msecond", "1.25"),
              row(1, gemm, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "80.1")]
    return "\n".join(lines) + "\n"


class NcuSummary(unittest.TestCase):
    def run_on(self, text):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ncu.csv")
            with open(path, "w") as f:
                f.write(text)
            return subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, check=True).stdout

    def test_one_line_per_launch(self):
        lines = self.run_on(report()).splitlines()
        self.assertEqual(lines[0].split(), ["id", "us", "SM%", "L2%", "DRAM%", "grid", "cluster", "warps", "regs",
                                            "issue", "Minst", "kernel"])
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[1].split()[:11],
                         ["0", "396.9", "51.4", "52.2", "34.7", "4096", "0", "15.7", "122", "0.62", "75.2"])
        self.assertIn("dqk_kernel", lines[1])
        self.assertEqual(lines[2].split()[:11], ["1", "1250.0", "80.1", "-", "-", "-", "-", "-", "-", "-", "-"])
        self.assertIn("nvjet_sm90", lines[2])


if __name__ == "__main__":
    unittest.main()
