#!/usr/bin/env python3
"""scripts/ncu_stalls.py on a hand-made `ncu --csv --page source --print-source sass` listing of two
kernels: each kernel's share of samples by stall reason, its mbarrier waits summed over the try-wait
and the branch that retries it (inline, or out of line where the branch jumps to a retry loop),
keyed by the barrier's offset whatever base register addresses it, the busiest instructions first;
a missing file or one without a source page refused with one line and exit status 2.
"""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ncu_stalls.py")

REASONS = ["stall_barrier", "stall_long_sb", "stall_wait"]
HEADER = (['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"', '"Instructions Executed"'] +
          ['"%s"' % r for r in REASONS] + ['"%s (Not Issued)"' % r for r in REASONS])


def instr(addr, src, barrier=0, long_sb=0, wait=0):
    counts = [barrier, long_sb, wait]
    cells = ["0x7f00000%s" % addr, "      " + src, str(sum(counts)), "100"] + [str(c) for c in counts] * 2
    return ",".join('"%s"' % c for c in cells)


def listing():
    lines = ['"Kernel Name","void bwd_kernel<128>(Args)",', ",".join(HEADER)]
    lines += [
        instr("0a000", "MOV R0, RZ", wait=10),
        # an inline retry loop on the barrier at +0x400
        instr("0a010", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR23+0x400], R0", long_sb=5),
        instr("0a020", "@!P0  BRA 0x7f000000a010", long_sb=40),
        # the same barrier through another base register: one key
        instr("0a030", "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R5+URZ+0x400], R4", long_sb=0),
        instr("0a040", "@!P2  BRA 0x7f000000a0a0", long_sb=15),
        instr("0a050", "BAR.SYNC.DEFER_BLOCKING 0x0", barrier=20),
        instr("0a060", "EXIT"),
        # the out-of-line retry loop of the barrier at +0x408, reached from 0a080
        instr("0a070", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR16+0x408], R0"),
        instr("0a080", "@!P1  BRA 0x7f000000a090", long_sb=5),
        instr("0a090", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR16+0x408], R0", long_sb=0),
        instr("0a0a0", "@!P1  BRA 0x7f000000a090"),
        # a branch into that loop from elsewhere: its samples are the wait's too
        instr("0a0b0", "MOV R1, R2"),
        instr("0a0c0", "@!P3  BRA 0x7f000000a090", long_sb=5),
    ]
    lines += ['"Kernel Name","void second_kernel(float *)",', ",".join(HEADER),
              instr("0b000", "FFMA R1, R2, R3, R1", wait=3), instr("0b010", "STG.E [R4.64], R1", long_sb=1)]
    return "\n".join(lines) + "\n"


class NcuStalls(unittest.TestCase):
    def run_on(self, text, *args):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "source.csv")
            with open(path, "w") as f:
                f.write(text)
            return subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True, text=True)

    def test_reasons_barriers_and_top_instructions(self):
        r = self.run_on(listing(), "--top", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        first, second = r.stdout.split("== void second_kernel")
        self.assertIn("bwd_kernel<128>", first)
        self.assertIn("100 samples", first)
        reasons = {l.split()[0]: l.split()[1] for l in first.splitlines()
                   if l.strip().startswith(("long_sb", "barrier", "wait"))}
        self.assertEqual(reasons, {"long_sb": "70.0%", "barrier": "20.0%", "wait": "10.0%"})
        waits = first.split("mbarrier waits")[1].split("top 2")[0].split()
        # +0x400: 5 + 40 at the inline loop, 15 at the branch after its try-wait through R5; +0x408: 5 + 5
        self.assertEqual(waits[waits.index("+0x400") + 1], "60.0%")
        self.assertEqual(waits[waits.index("+0x408") + 1], "10.0%")
        top = first.split("top 2 instructions")[1].splitlines()[1:3]
        self.assertTrue(top[0].split()[0] == "0a020" and "40.0%" in top[0] and "long_sb 40" in top[0], top)
        self.assertTrue(top[1].split()[0] == "0a050" and "barrier 20" in top[1], top)
        self.assertIn("4 samples", second)
        self.assertNotIn("mbarrier waits", second)

    def test_bad_input_is_one_line_and_status_2(self):
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/source.csv"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)
        self.assertIn("cannot read /nonexistent/source.csv", r.stderr)
        r = self.run_on('"ID","Kernel Name","Metric Name"\n"0","k","Duration"\n')
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)
        self.assertIn("has no source page", r.stderr)


if __name__ == "__main__":
    unittest.main()
