#!/usr/bin/env python3
"""scripts/ncu_summary.py on a hand-made `ncu --csv --page details` report: one line per launch in
report order, durations in us and the SM clock in GHz whatever unit ncu printed them in, thousands
separators read, the tensor-pipe, warps, registers, issue-rate and instruction columns where the
report has them and '-' where it does not, the lines before the header (ncu's own messages, the
program's output) skipped.
"""
import unittest

from fixtures import run_on_text

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
              row(0, dqk, "GPU Speed Of Light Throughput", "SM Frequency", "Mhz", "1,547.63"),
              row(0, dqk, "Command line profiler metrics",
                  "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "%", "86.76"),
              row(0, dqk, "Launch Statistics", "Grid Size", "", "4,096"),
              row(0, dqk, "Launch Statistics", "Cluster Size", "", "0"),
              row(0, dqk, "Launch Statistics", "Registers Per Thread", "register/thread", "122"),
              row(0, dqk, "Occupancy", "Achieved Active Warps Per SM", "warp", "15.67"),
              row(0, dqk, "Scheduler Statistics", "Issued Warp Per Scheduler", "", "0.62"),
              row(0, dqk, "Instruction Statistics", "Executed Instructions", "inst", "75,223,296")]
    gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"  # no Occupancy / LaunchStats sections
    lines += [row(1, gemm, "GPU Speed Of Light Throughput", "Duration", "msecond", "1.25"),
              row(1, gemm, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "80.1"),
              row(1, gemm, "GPU Speed Of Light Throughput", "SM Frequency", "cycle/nsecond", "1.60")]
    return "\n".join(lines) + "\n"


class NcuSummary(unittest.TestCase):
    def run_on(self, text):
        r = run_on_text("ncu_summary.py", text)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_one_line_per_launch(self):
        lines = self.run_on(report()).splitlines()
        self.assertEqual(lines[0].split(), ["id", "us", "SM%", "L2%", "DRAM%", "GHz", "tensor%", "grid", "cluster",
                                            "warps", "regs", "issue", "Minst", "kernel"])
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[1].split()[:13], ["0", "396.9", "51.4", "52.2", "34.7", "1.55", "86.8", "4096", "0",
                                                 "15.7", "122", "0.62", "75.2"])
        self.assertIn("dqk_kernel", lines[1])
        self.assertEqual(lines[2].split()[:13],
                         ["1", "1250.0", "80.1", "-", "-", "1.60", "-", "-", "-", "-", "-", "-", "-"])
        self.assertIn("nvjet_sm90", lines[2])


if __name__ == "__main__":
    unittest.main()
