#!/usr/bin/env python3
"""scripts/code_size.py on a two-kernel .cu file compiled here (skipped without nvcc): every kernel
with the bytes readelf gives its code, the larger first, its bytes split over source lines (the
unrolled loop's line the largest share of the kernel that unrolls it), `--kernel` choosing kernels;
`--build` compiling the source with its object's flags from the build's ninja rules (a stand-in
ninja prints them) for one architecture, whatever gencode list the flags carry; a missing file, a
.cu file without --build, a file that is no cubin and a filter that matches nothing refused with
one line and exit status 2; `--against REV` telling, per kernel, whether the source compiles to the
same machine code as in a git revision (a kernel changed in the working tree differs, the other is
the same, a new one is "only here"; exit status 0 only when all are the same), an unknown revision
refused.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "code_size.py")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)

SOURCE = r"""
__global__ void unrolled_kernel(float* x, const int* flag) {
  float acc = x[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    if (flag[i]) acc = acc * x[i] + 1.f;  // LINE_UNROLLED
  }
  x[threadIdx.x] = acc;
}
__global__ void small_kernel(float* x) { x[threadIdx.x] += 1.f; }
"""

NINJA = r"""#!/bin/sh
# stand-in ninja: one object, whose command compiles %(src)s for two architectures
case "$*" in
  *"-t targets"*) echo "CMakeFiles/k.dir/unit.cu.o: CUDA_COMPILER__k_Release"; echo "all: phony" ;;
  *"-t commands"*) echo "%(nvcc)s -O3 -lineinfo --generate-code=arch=compute_80,code=[compute_80,sm_80] -gencode=arch=compute_90a,code=sm_90a -MD -MT CMakeFiles/k.dir/unit.cu.o -MF CMakeFiles/k.dir/unit.cu.o.d -x cu -c %(src)s -o CMakeFiles/k.dir/unit.cu.o" ;;
  *) exit 1 ;;
esac
"""


@unittest.skipIf(NVCC is None, "no nvcc")
class CodeSize(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.src = os.path.join(cls.tmp, "unit.cu")
        with open(cls.src, "w") as f:
            f.write(SOURCE)
        cls.line = SOURCE.splitlines().index(next(l for l in SOURCE.splitlines() if "LINE_UNROLLED" in l)) + 1
        cls.cubin = os.path.join(cls.tmp, "unit.cubin")
        subprocess.run([NVCC, "-cubin", "-lineinfo", "-O3", "-arch=sm_80", "-o", cls.cubin, cls.src], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def run_script(self, *args, env=None):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env)

    def sizes(self, cubin):
        out = subprocess.run(["readelf", "-S", "-W", cubin], capture_output=True, text=True).stdout
        return {m.group(1): int(m.group(2), 16)
                for m in re.finditer(r"\.text\.(\S+)\s+PROGBITS\s+\S+\s+\S+\s+([0-9a-fA-F]+)", out)}

    def kernels(self, out):
        return [(int(l.split()[0]), l.split("bytes")[1].strip()) for l in out.splitlines() if " bytes " in l]

    def test_kernels_and_their_lines(self):
        r = self.run_script(self.cubin, "--top", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        got = self.kernels(r.stdout)
        self.assertEqual([n for _, n in got], ["unrolled_kernel(float*, int const*)", "small_kernel(float*)"])
        sizes = self.sizes(self.cubin)
        self.assertEqual(sorted(b for b, _ in got), sorted(sizes.values()))
        body = r.stdout.split("small_kernel")[0].splitlines()[1:]
        shares = [(int(l.split()[0]), l.split()[2]) for l in body if "%" in l]
        self.assertEqual(len(shares), 3, r.stdout)
        self.assertTrue(shares[0][1].endswith("unit.cu:%d" % self.line), r.stdout)
        self.assertGreater(shares[0][0], got[0][0] // 2)  # the unrolled body is most of the kernel
        self.assertLessEqual(sum(b for b, _ in shares), got[0][0])

    def test_kernel_filter(self):
        r = self.run_script(self.cubin, "--kernel", "^small")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([n for _, n in self.kernels(r.stdout)], ["small_kernel(float*)"])
        r = self.run_script(self.cubin, "--kernel", "nothing_like_this")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no kernel of", r.stderr)

    def test_build_mode_compiles_for_one_arch(self):
        bin_dir = os.path.join(self.tmp, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        with open(os.path.join(bin_dir, "ninja"), "w") as f:
            f.write(NINJA % {"src": self.src, "nvcc": NVCC})
        os.chmod(os.path.join(bin_dir, "ninja"), 0o755)
        build = os.path.join(self.tmp, "build")
        os.makedirs(build, exist_ok=True)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
        r = self.run_script("--build", build, self.src, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(n for _, n in self.kernels(r.stdout)),
                         ["small_kernel(float*)", "unrolled_kernel(float*, int const*)"])
        self.assertIn("unit.cu:%d" % self.line, r.stdout)

    def test_against_a_revision(self):
        # unit.cu committed in a repository of its own, compiled through the stand-in ninja
        repo = os.path.join(self.tmp, "repo")
        os.makedirs(repo, exist_ok=True)
        src = os.path.join(repo, "unit.cu")
        with open(src, "w") as f:
            f.write(SOURCE)
        git = ["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "unit.cu"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", "unit"], check=True)
        bin_dir = os.path.join(self.tmp, "bin_repo")
        os.makedirs(bin_dir, exist_ok=True)
        with open(os.path.join(bin_dir, "ninja"), "w") as f:
            f.write(NINJA % {"src": src, "nvcc": NVCC})
        os.chmod(os.path.join(bin_dir, "ninja"), 0o755)
        build = os.path.join(self.tmp, "build_repo")
        os.makedirs(build, exist_ok=True)
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])

        r = self.run_script("--build", build, src, "--against", "HEAD", env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sum(l.startswith("same ") for l in r.stdout.splitlines()), 2, r.stdout)
        self.assertIn("2 of 2 kernels", r.stdout)

        # one kernel's arithmetic changed in the working tree: it differs, the other is the same
        with open(src, "w") as f:
            f.write(SOURCE.replace("x[threadIdx.x] += 1.f", "x[threadIdx.x] *= 3.f"))
        r = self.run_script("--build", build, src, "--against", "HEAD", env=env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(any(l.startswith("differs") and "small_kernel" in l for l in lines), r.stdout)
        self.assertTrue(any(l.startswith("same ") and "unrolled_kernel" in l for l in lines), r.stdout)
        self.assertIn("1 of 2 kernels", r.stdout)
        r = self.run_script("--build", build, src, "--against", "HEAD", "--kernel", "^unrolled", env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        # a kernel the revision does not have
        with open(src, "a") as f:
            f.write("__global__ void new_kernel(float* x) { x[0] = 0.f; }\n")
        r = self.run_script("--build", build, src, "--against", "HEAD", env=env)
        self.assertEqual(r.returncode, 1)
        self.assertTrue(any(l.startswith("only here") and "new_kernel" in l for l in r.stdout.splitlines()), r.stdout)

        for args, text in [(["--against", "no_such_rev"], "git archive no_such_rev failed"),
                           (["--against", "HEAD", "--kernel", "nothing_like_this"], "no kernel of")]:
            r = self.run_script("--build", build, src, *args, env=env)
            self.assertEqual(r.returncode, 2, args)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(text, r.stderr)
        r = self.run_script(self.cubin, "--against", "HEAD")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--against compares a .cu file", r.stderr)

    def test_bad_input_is_one_line_and_status_2(self):
        cases = [(["/nonexistent.cubin"], "cannot read"), ([self.src], "--build DIR"), ([SCRIPT], "is not a cubin")]
        for args, text in cases:
            r = self.run_script(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(text, r.stderr)


if __name__ == "__main__":
    unittest.main()
