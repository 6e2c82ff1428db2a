#!/usr/bin/env python3
"""scripts/sass_mix.py on a hand-made `cuobjdump -sass` listing: per kernel its instruction count
and opcode mix (guard predicates and modifiers dropped), each loop from a backward branch's
target to the branch with its length, forward branches not taken for loops, --kernel choosing
kernels by name, bad usage refused with one line and status 2.
"""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "sass_mix.py")

LISTING = """
Fatbin elf code:
================
        code for sm_90
                Function : copy_kernel
        .headerflags    @"EF_CUDA_TEXMODE_UNIFIED"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                      /* 0x0000000000007919 */
        /*0020*/              @!P0 BRA 0x60 ;                              /* 0x0000000000008947 */
        /*0030*/                   LDS.U16 R2, [R0] ;                      /* 0x0000000000027984 */
        /*0040*/              @!PT LDS RZ, [RZ] ;                          /* 0x0000000000ff7984 */
        /*0050*/                   FMUL R2, R2, 0.5 ;                      /* 0x0000000000027820 */
        /*0060*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;   /* 0x0000000000047823 */
        /*0070*/                   ISETP.GE.AND P1, PT, R0, 0x40, PT ;     /* 0x0000000000007c0c */
        /*0080*/              @!P1 BRA 0x30 ;                              /* 0x0000000000009947 */
        /*0090*/                   EXIT ;                                  /* 0x000000000000794d */
        /*00a0*/                   BRA 0xa0;                               /* 0x0000000000007947 */
                ..........
                Function : other_kernel
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   EXIT ;                                  /* 0x000000000000794d */
"""


class SassMix(unittest.TestCase):
    def run_script(self, *args, listing=LISTING, check=True):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.sass")
            with open(path, "w") as f:
                f.write(listing)
            return subprocess.run([sys.executable, SCRIPT, *args, path], capture_output=True, text=True, check=check)

    def test_kernels_and_loops(self):
        lines = self.run_script().stdout.splitlines()
        self.assertEqual(lines[0], "copy_kernel: 11 instructions (BRA 3, LDS 2, LDC 1, S2R 1, FMUL 1, HMMA 1, ISETP 1, "
                                   "EXIT 1)")
        self.assertEqual(lines[1], "  loop 0x30-0x80: 6 instructions (LDS 2, FMUL 1, HMMA 1, ISETP 1, BRA 1)")
        self.assertEqual(lines[2], "  loop 0xa0-0xa0: 1 instructions (BRA 1)")
        self.assertEqual(lines[3], "other_kernel: 2 instructions (MOV 1, EXIT 1)")
        self.assertEqual(len(lines), 4)

    def test_kernel_filter_and_top(self):
        lines = self.run_script("--kernel", "^other", "--top", "1").stdout.splitlines()
        self.assertEqual(lines, ["other_kernel: 2 instructions (MOV 1)"])

    def test_bad_usage(self):
        r = self.run_script("--kernel", "(", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)
        self.assertIn("--kernel", r.stderr)
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/k.sass"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)
        self.assertIn("/nonexistent/k.sass", r.stderr)


if __name__ == "__main__":
    unittest.main()
