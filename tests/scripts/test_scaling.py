#!/usr/bin/env python3
"""scripts/scaling.sh against stand-ins for nvidia-smi (4 GPUs) and mpirun (a `linac bench --json`
row whose tokens/s depend on the rank count, overlap, ZeRO setting and reduce dtype): one 1-GPU
baseline per config, every (overlap, ZeRO, reduce dtype, GPUs > 1) row with its efficiencies (mean
and median step) against that baseline, counts past the GPUs present skipped, and a failed run
reported without stopping the rest. MICRO_PER_RANK, STEPS and WARMUP reach every run's command line
(the baseline's too), and NCCL_ENV's variables every rank's environment, forwarded with -x.
"""
import json
import os
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NVIDIA_SMI = """#!/bin/sh
for i in 0 1 2 3; do echo "GPU $i: stand-in"; done
"""

# Logs each call (ranks, settings, bench options, -x names and the NCCL variables it sees);
# tokens/s = 1000 n (1 - 0.01 n) - 5000 (overlap) + 3000 (ZeRO) + 2000 (bf16), median step
# 50 + n ms; 4 GPUs with overlap off and ZeRO-1 fails (prints nothing).
MPIRUN = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
n = int(args[args.index("-np") + 1])
sets = dict(a.split("=", 1) for a in args if a.startswith("train."))
opt = lambda name: args[args.index(name) + 1]
with open(os.environ["MPIRUN_LOG"], "a") as f:
    f.write(json.dumps({"n": n, "overlap": sets["train.overlap_comm"], "zero": sets["train.zero"],
                        "reduce": sets["train.reduce_dtype"], "tokens_per_step": int(opt("--tokens-per-step")),
                        "micro_tokens": int(opt("--micro-tokens")), "steps": int(opt("--steps")),
                        "warmup": int(opt("--warmup")),
                        "forwarded": [args[i + 1] for i, a in enumerate(args) if a == "-x"],
                        "env": {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")}}) + "\\n")
ov, z, bf = sets["train.overlap_comm"] == "true", sets["train.zero"] == "1", sets["train.reduce_dtype"] == "bf16"
if n == 4 and not ov and z:
    sys.exit(1)
tps = 1000 * n * (1 - 0.01 * n) * 1000 - (5000 if ov and n > 1 else 0) + (3000 if z and n > 1 else 0) + \\
    (2000 if bf and n > 1 else 0)
print(json.dumps({"rows": [{"tokens_per_s": tps, "peak_bytes": 2 ** 30 * (2 if z else 3), "step_ms_median": 50 + n}]}))
"""

CONFIGS = ("configs/transformer_125m.json", "configs/gla_340m.json")


class ScalingScript(unittest.TestCase):
    def scaling(self, **env):
        """Runs scaling.sh on "1 2 4 8" GPUs with the stand-ins and `env`; returns (stdout, logged calls)."""
        with tempfile.TemporaryDirectory() as d:
            for name, text in (("nvidia-smi", NVIDIA_SMI), ("mpirun", MPIRUN)):
                path = os.path.join(d, name)
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
            log = os.path.join(d, "calls.log")
            full = {k: v for k, v in os.environ.items() if k not in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")}
            full.update(PATH=d + os.pathsep + os.environ["PATH"], MPIRUN_LOG=log, CONFIGS=" ".join(CONFIGS), **env)
            out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "scaling.sh"), "build", "1 2 4 8"],
                                 capture_output=True, text=True, env=full, timeout=120, check=True).stdout
            with open(log) as f:
                return out, [json.loads(line) for line in f if line.strip()]

    def test_one_baseline_per_config_and_every_setting_against_it(self):
        out, calls = self.scaling(OVERLAP="true false", ZERO="0 1", REDUCE="f32 bf16")
        rows = [r for r in (line.split() for line in out.splitlines()) if r and r[-1] == "GiB"]  # table rows
        for cfg in CONFIGS:
            mine = [r for r in rows if r[0] == cfg]
            baseline = [cfg, "-", "-", "-", "1", "990000", "990000", "100.0%", "100.0%", "3.00", "GiB"]
            self.assertEqual([r for r in mine if r[4] == "1"], [baseline])
            got = {(r[1], r[2], r[3], int(r[4])): r for r in mine if r[4] != "1"}
            want = {(ov, z, rd, n) for ov in ("true", "false") for z in ("0", "1") for rd in ("f32", "bf16")
                    for n in (2, 4)}
            want -= {("false", "1", rd, 4) for rd in ("f32", "bf16")}  # the failed runs
            self.assertEqual(set(got), want)  # and no 8-GPU rows: 4 GPUs present
            for (ov, z, rd, n), r in got.items():
                tps = 1000 * n * (1 - 0.01 * n) * 1000 - (5000 if ov == "true" else 0) + (3000 if z == "1" else 0) + \
                    (2000 if rd == "bf16" else 0)
                self.assertEqual(float(r[5]), round(tps))
                self.assertEqual(r[7], f"{100 * tps / (n * 990000):.1f}%")
                self.assertEqual(r[8], f"{100 * 51 / (50 + n):.1f}%")
            for rd in ("f32", "bf16"):
                self.assertIn(f"{cfg} on 4 GPUs (overlap false, zero 1, reduce {rd}) failed", out)
        baselines = [c for c in calls if c["n"] == 1]
        self.assertEqual(len(baselines), 2)  # one per config, in f32
        self.assertTrue(all(c["reduce"] == "f32" for c in baselines))
        self.assertFalse(any(c["n"] == 8 for c in calls))
        # The defaults: one micro-batch per rank per step, 10 timed steps after 3, no NCCL variables.
        for c in calls:
            self.assertEqual((c["tokens_per_step"], c["micro_tokens"], c["steps"], c["warmup"]), (32768, 32768, 10, 3))
            self.assertEqual(c["forwarded"], ["NCCL_NVLS_ENABLE", "LD_LIBRARY_PATH"])
            self.assertEqual(c["env"], {"NCCL_P2P_DISABLE": None, "NCCL_SHM_DISABLE": None})

    def test_micro_batches_steps_and_nccl_environment_reach_every_run(self):
        out, calls = self.scaling(OVERLAP="true", REDUCE="f32 bf16", MICRO_PER_RANK="8", STEPS="6", WARMUP="2",
                                  NCCL_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1")
        self.assertIn("# 8 micro-batch(es) of 32768 tokens per rank per step, 6 timed after 2 warm-up, "
                      "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1", out)
        self.assertEqual(sorted((c["n"], c["reduce"]) for c in calls),
                         sorted([(1, "f32")] * 2 + [(n, rd) for n in (2, 4) for rd in ("f32", "bf16")] * 2))
        for c in calls:
            self.assertEqual((c["tokens_per_step"], c["micro_tokens"], c["steps"], c["warmup"]),
                             (8 * 32768, 32768, 6, 2))
            self.assertEqual(c["forwarded"],
                             ["NCCL_NVLS_ENABLE", "LD_LIBRARY_PATH", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"])
            self.assertEqual(c["env"], {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
        rows = [r for r in (line.split() for line in out.splitlines()) if r and r[-1] == "GiB"]
        self.assertEqual(len(rows), 2 * (1 + 4))


if __name__ == "__main__":
    unittest.main()
