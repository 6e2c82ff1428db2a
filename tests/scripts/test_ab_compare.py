#!/usr/bin/env python3
"""scripts/ab_compare.sh (shell syntax, and shellcheck when installed) in a scratch copy of the
scripts with stand-ins for linac, linac_gpu_tests, cmake and ninja: the baseline tree is built
(its stand-in ninja copies a linac that reports other times), the named tests run, each model
bench alternates this tree's binary and the baseline's (or each of several baselines') with the
right means, each op bench alternates the same way (an op's --seq-lens list one T at a time), and a
missing build or baseline is refused with one line and status 2.
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from fixtures import assert_shell_clean  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ab_compare.sh")

# A stand-in linac: `bench CONFIG ...` prints a header and one step line whose ms is $MS plus a
# fraction from the run count kept in a file beside it (so the two sides and the rounds all differ); `bench --op`
# prints an op table row for each T of its --seq-lens.
LINAC = """#!/bin/bash
here=$(dirname "$0"); n=$(cat "$here/runs" 2>/dev/null || echo 0); echo $((n + 1)) > "$here/runs"
lens=2048; prev=""; for a in "$@"; do [ "$prev" = --seq-lens ] && lens=$a; prev=$a; done
if [ "$2" = "--op" ]; then
  echo "op header"; for t in ${lens//,/ }; do echo "    $t    16      0.500      1.000      1.$MS$n       9.9"; done; exit 0
fi
echo "header"; echo "    2048     16      1      32768      $MS.$((2 * n))       400000   40.0%"
"""


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class AbCompare(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        d = self.dir
        os.makedirs(os.path.join(d, "scripts"))
        for s in ("ab.sh", "ab_compare.sh"):
            shutil.copy(os.path.join(ROOT, "scripts", s), os.path.join(d, "scripts", s))
        os.makedirs(os.path.join(d, "build-gpu"))
        executable(os.path.join(d, "build-gpu", "linac"), LINAC.replace("$MS", "70"))
        executable(os.path.join(d, "build-gpu", "linac_gpu_tests"),
                   '#!/bin/bash\necho "filter $2"; echo "[  PASSED  ] 3 tests."\n')
        os.makedirs(os.path.join(d, "ab_base"))
        open(os.path.join(d, "ab_base", "CMakeLists.txt"), "w").close()
        os.makedirs(os.path.join(d, "bin"))
        executable(os.path.join(d, "bin", "cmake"), "#!/bin/bash\nexit 0\n")
        # The stand-in ninja builds a linac reporting 80 ms (90 in a tree named ab_mid) and keeps its
        # arguments beside it.
        with open(os.path.join(d, "linac.template"), "w") as f:
            f.write(LINAC)
        executable(os.path.join(d, "bin", "ninja"),
                   "#!/bin/bash\nms=80; [ \"$(basename \"$PWD\")\" = ab_mid ] && ms=90\nmkdir -p build-gpu\n"
                   "sed \"s/\\$MS/$ms/g\" " + os.path.join(d, "linac.template") + " > build-gpu/linac\n"
                   "chmod +x build-gpu/linac\necho \"$@\" > build-gpu/ninja_args\n")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_script(self, **env):
        e = dict(os.environ)
        e.update({"PATH": os.path.join(self.dir, "bin") + os.pathsep + e["PATH"], "NCCL_ROOT": "/none",
                  "OUT": os.path.join(self.dir, "out")})
        for k in ("AB_BASE", "AB_TESTS", "AB_CONFIGS", "AB_OPS", "AB_ROUNDS"):
            e.pop(k, None)
        e.update(env)
        return subprocess.run(["bash", os.path.join(self.dir, "scripts", "ab_compare.sh")], capture_output=True,
                              text=True, timeout=120, env=e)

    def test_shell_syntax_and_shellcheck(self):
        assert_shell_clean(self, SCRIPT)

    def test_builds_the_baseline_runs_the_tests_and_alternates(self):
        r = self.run_script(AB_BASE="ab_base", AB_TESTS="Latte*", AB_ROUNDS="2", AB_CONFIGS="configs/a.json",
                            AB_OPS="--op latte --seq-lens 2048")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("tests (Latte*) rc=0: [  PASSED  ] 3 tests."), lines[0])
        new = os.path.join(self.dir, "build-gpu", "linac")
        base = os.path.join(self.dir, "ab_base", "build-gpu", "linac")
        runs = [l for l in lines if l.startswith("round ")]
        self.assertEqual(len(runs), 8)  # two rounds of two sides, for the model and for the op
        for i, l in enumerate(runs):
            self.assertIn("LINAC=" + (new if i % 2 == 0 else base) + " ", l)
        # Each binary counts its own runs: this tree 70.0 and 70.2, the baseline 80.0 and 80.2.
        self.assertIn("  this tree: 70.10 ms per step (mean of 2)", lines)
        self.assertIn("  baseline: 80.10 ms per step (mean of 2)", lines)
        self.assertIn("1.702", runs[4])  # the op rows: this tree's third run
        self.assertIn("1.802", runs[5])
        with open(os.path.join(self.dir, "out", "ab.log")) as f:
            self.assertIn("== --op latte --seq-lens 2048", f.read())

    def test_two_baselines_alternate_with_this_tree_and_share_the_jobs(self):
        os.makedirs(os.path.join(self.dir, "ab_mid"))
        open(os.path.join(self.dir, "ab_mid", "CMakeLists.txt"), "w").close()
        r = self.run_script(AB_BASE="ab_base ab_mid", AB_ROUNDS="2", AB_CONFIGS="configs/a.json",
                            AB_OPS="--op taylor --seq-lens 8192")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        runs = [l for l in lines if l.startswith("round ")]
        self.assertEqual(len(runs), 12)  # two rounds of three sides, for the model and for the op
        sides = [os.path.join(self.dir, t, "build-gpu", "linac") for t in ("", "ab_base", "ab_mid")]
        for i, l in enumerate(runs):
            self.assertIn("LINAC=" + sides[i % 3] + " ", l)
        self.assertIn("  this tree: 70.10 ms per step (mean of 2)", lines)
        self.assertIn("  baseline ab_base: 80.10 ms per step (mean of 2)", lines)
        self.assertIn("  baseline ab_mid: 90.10 ms per step (mean of 2)", lines)
        for t in ("ab_base", "ab_mid"):
            with open(os.path.join(self.dir, t, "build-gpu", "ninja_args")) as f:
                self.assertIn("-j8 ", f.read())
            self.assertTrue(os.path.exists(os.path.join(self.dir, "out", "ab_build_%s.log" % t)))

    def test_an_op_runs_one_sequence_length_at_a_time(self):
        # ab.sh keeps one line per run: a --seq-lens list would report only its last T.
        r = self.run_script(AB_BASE="ab_base", AB_ROUNDS="1", AB_OPS="--op gla --seq-lens 2048,8192 --heads 4")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        runs = [l.split(" : ")[1].split()[0] for l in r.stdout.splitlines() if l.startswith("round ")]
        self.assertEqual(runs, ["2048", "2048", "8192", "8192"])
        with open(os.path.join(self.dir, "out", "ab.log")) as f:
            log = f.read()
        self.assertIn("== --op gla --seq-lens 2048 --heads 4\n", log)
        self.assertIn("== --op gla --seq-lens 8192 --heads 4\n", log)

    def test_refusals_are_one_line_and_status_2(self):
        for env in ({}, {"AB_BASE": "nowhere"}, {"AB_BASE": "ab_base nowhere"}):
            r = self.run_script(**env)
            self.assertEqual(r.returncode, 2, env)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertTrue(r.stderr.startswith("ab_compare.sh: "), r.stderr)
        os.remove(os.path.join(self.dir, "build-gpu", "linac"))
        r = self.run_script(AB_BASE="ab_base")
        self.assertEqual(r.returncode, 2)
        self.assertIn("is not built", r.stderr)


if __name__ == "__main__":
    unittest.main()
