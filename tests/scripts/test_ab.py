#!/usr/bin/env python3
"""scripts/ab.sh (shell syntax, and shellcheck when installed) with a stand-in command: the variants alternate within each round, each run
reports the last line matching --grep (or its last line) under its settings, "-" runs the
environment as it is, a failed run is reported with its status and makes the exit status 1, and
bad usage is refused with one line and status 2.
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from fixtures import assert_shell_clean  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "ab.sh")

# Prints a header, two result lines (the second the one to report) and the variant's settings.
COMMAND = ["sh", "-c", 'echo header; echo "result ${X:-unset} 0"; echo "result ${X:-unset} ${Y:-none}"; echo tail']


def run(*args, env=None):
    e = dict(os.environ)
    e.pop("X", None)
    e.pop("Y", None)
    e.update(env or {})
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60, env=e)


class Ab(unittest.TestCase):
    def test_shell_syntax_and_shellcheck(self):
        assert_shell_clean(self, SCRIPT)

    def test_variants_alternate_and_report_the_matching_line(self):
        r = run("--rounds", "2", "--grep", "^result", "-", "X=1", "X=2 Y=b", "--", *COMMAND)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines, [
            "round 1  -       : result unset none",
            "round 1  X=1     : result 1 none",
            "round 1  X=2 Y=b : result 2 b",
            "round 2  -       : result unset none",
            "round 2  X=1     : result 1 none",
            "round 2  X=2 Y=b : result 2 b",
        ])

    def test_last_line_without_grep_and_one_round(self):
        r = run("--rounds", "1", "X=7", "--", *COMMAND)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["round 1  X=7 : tail"])
        r = run("--rounds", "1", "--grep", "^nothing", "X=7", "--", *COMMAND)
        self.assertEqual(r.stdout.splitlines(), ["round 1  X=7 : no line matched"])

    def test_failed_run_is_reported_and_sets_status_1(self):
        r = run("--rounds", "1", "X=0", "X=3", "--", "sh", "-c", 'echo "out $X"; exit $X')
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout.splitlines(), ["round 1  X=0 : out 0", "round 1  X=3 : exit status 3: out 3"])

    def test_bad_usage_is_one_line_and_status_2(self):
        for args in (["X=1"], ["--", "true"], ["FOO", "--", "true"], ["--rounds", "0", "X=1", "--", "true"],
                     ["--rounds"], ["X=1 bad", "--", "true"]):
            r = run(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))
            self.assertTrue(r.stderr.startswith("ab.sh: "), r.stderr)
            self.assertEqual(r.stdout, "")


if __name__ == "__main__":
    unittest.main()
