#!/usr/bin/env python3
"""scripts/scaling.sh against stand-ins for nvidia-smi (4 GPUs) and mpirun (a `linac bench --json`
row whose tokens/s depend on the rank count, overlap and ZeRO setting): one 1-GPU baseline per
config, every (overlap, ZeRO, GPUs > 1) row with its efficiencies (mean and median step) against
that baseline, counts past
the GPUs present skipped, and a failed run reported without stopping the rest.
"""
import os
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NVIDIA_SMI = """#!/bin/sh
for i in 0 1 2 3; do echo "GPU $i: stand-in"; done
"""

# Logs each call; tokens/s = 1000 n (1 - 0.01 n) - 5000 (overlap) + 3000 (ZeRO), median step
# 50 + n ms; 4 GPUs with overlap off and ZeRO-1 fails (prints nothing).
MPIRUN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
n = int(args[args.index("-np") + 1])
sets = dict(a.split("=", 1) for a in args if a.startswith("train."))
with open(os.environ["MPIRUN_LOG"], "a") as f:
    f.write(f"{n} {sets['train.overlap_comm']} {sets['train.zero']}\\n")
ov, z = sets["train.overlap_comm"] == "true", sets["train.zero"] == "1"
if n == 4 and not ov and z:
    sys.exit(1)
tps = 1000 * n * (1 - 0.01 * n) * 1000 - (5000 if ov and n > 1 else 0) + (3000 if z and n > 1 else 0)
print(json.dumps({"rows": [{"tokens_per_s": tps, "peak_bytes": 2 ** 30 * (2 if z else 3), "step_ms_median": 50 + n}]}))
"""


class ScalingScript(unittest.TestCase):
    def test_one_baseline_per_config_and_every_setting_against_it(self):
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("nvidia-smi", NVIDIA_SMI), ("mpirun", MPIRUN)):
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
            log = os.path.join(d, "calls.log")
            env = dict(os.environ, PATH=d + os.pathsep + os.environ["PATH"], MPIRUN_LOG=log,
                       CONFIGS="configs/transformer_125m.json configs/gla_340m.json", OVERLAP="true false",
                       ZERO="0 1")
            out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "scaling.sh"), "build", "1 2 4 8"],
                                 capture_output=True, text=True, env=env, timeout=120, check=True).stdout
            rows = [r for r in (line.split() for line in out.splitlines()[1:]) if r and r[-1] == "GiB"]  # table rows
            for cfg in ("configs/transformer_125m.json", "configs/gla_340m.json"):
                mine = [r for r in rows if r[0] == cfg]
                baseline = [cfg, "-", "-", "1", "990000", "990000", "100.0%", "100.0%", "3.00", "GiB"]
                self.assertEqual([r for r in mine if r[3] == "1"], [baseline])
                got = {(r[1], r[2], int(r[3])): r for r in mine if r[3] != "1"}
                want = {(ov, z, n) for ov in ("true", "false") for z in ("0", "1") for n in (2, 4)}
                want.discard(("false", "1", 4))  # the failed run
                self.assertEqual(set(got), want)  # and no 8-GPU rows: 4 GPUs present
                for (ov, z, n), r in got.items():
                    tps = 1000 * n * (1 - 0.01 * n) * 1000 - (5000 if ov == "true" else 0) + (3000 if z == "1" else 0)
                    self.assertEqual(float(r[4]), round(tps))
                    self.assertEqual(r[6], f"{100 * tps / (n * 990000):.1f}%")
                    self.assertEqual(r[7], f"{100 * 51 / (50 + n):.1f}%")
                self.assertIn(f"{cfg} on 4 GPUs (overlap false, zero 1) failed", out)
            with open(log) as f:
                calls = f.read().split("\n")
            self.assertEqual(sum(1 for c in calls if c.startswith("1 ")), 2)  # one baseline per config
            self.assertFalse(any(c.startswith("8 ") for c in calls))


if __name__ == "__main__":
    unittest.main()
