#!/usr/bin/env python3
"""Fixtures of the scripts' tests (test_compare_table.py, test_plots.py; the shell check of test_ab.py
and test_ab_compare.py; running a summary script on a text in test_ncu_summary.py and
test_power_summary.py): a fake output directory of scripts/compare.sh (lm/<arch>/ and
mqar/<mixer>_d<width>/ with the files `linac train/eval/info/bench` write, some runs failed or
broken), subprocess helpers, and the choice of a Python with matplotlib for the cases that draw a
figure: the first of this interpreter and /usr/bin/python3 that has it (LINAC_PLOT_PYTHON=PATH
names the only one to try, LINAC_PLOT_PYTHON=none); those cases are skipped when none has it
(Debian: python3-matplotlib).
"""
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # importing the scripts leaves no __pycache__ in scripts/

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def script(name):
    return os.path.join(SCRIPTS, name)


def assert_shell_clean(case, path):
    """bash -n on the shell script PATH, and shellcheck where it is installed."""
    r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    case.assertEqual(r.returncode, 0, r.stderr)
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", path], capture_output=True, text=True)
        case.assertEqual(r.returncode, 0, r.stdout)


def run(python, name, *args, flags=()):
    """Runs scripts/NAME with PYTHON; the CompletedProcess (text stdout and stderr)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    env.pop("PYTHONPATH", None)
    return subprocess.run([python, *flags, script(name), *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def run_on_text(name, text):
    """Runs scripts/NAME with this Python on a temporary file holding TEXT (its only argument)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "input.csv")
        with open(path, "w") as f:
            f.write(text)
        return run(sys.executable, name, path)


def has_matplotlib(python, *flags):
    try:
        return subprocess.run([python, *flags, "-c", "import matplotlib"], capture_output=True,
                              timeout=60, check=False).returncode == 0
    except OSError:
        return False


def find_plot_python():
    """(the first candidate Python that imports matplotlib or None, the candidates tried)."""
    if "LINAC_PLOT_PYTHON" in os.environ:
        candidates = [os.environ["LINAC_PLOT_PYTHON"]] if os.environ["LINAC_PLOT_PYTHON"] else []
    else:
        candidates = [sys.executable] + (["/usr/bin/python3"] if os.path.exists("/usr/bin/python3") else [])
    return next((py for py in candidates if has_matplotlib(py)), None), candidates


PLOT_PY, PLOT_CANDIDATES = find_plot_python()
NEEDS_MATPLOTLIB = unittest.skipUnless(
    PLOT_PY, f"no Python with matplotlib (tried: {', '.join(PLOT_CANDIDATES) or 'none'}; "
             "Debian: apt-get install python3-matplotlib, as scripts/setup.sh does)")


def load_script(name):
    """scripts/NAME.py as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(f"linac_script_{name}", script(name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path, obj):
    write(path, json.dumps(obj, indent=2) + "\n")


def write_jsonl(path, records):
    write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def svg_texts(path):
    """The texts matplotlib draws as paths into an SVG; it writes each as a comment <!-- text -->."""
    with open(path, encoding="utf-8") as f:
        svg = f.read()
    texts, start = set(), 0
    while (start := svg.find("<!-- ", start)) >= 0:
        end = svg.find(" -->", start)
        texts.add(svg[start + 5:end])
        start = end
    return texts


# ---- fixtures ----

# A run that was resumed twice: each process's time_s starts again from zero; the first resume
# (from the checkpoint at step 20) redoes step 30. Step 26 was skipped (non-finite gradient).
TRANSFORMER_METRICS = [
    {"step": 10, "loss": 5.0, "lr": 1e-4, "grad_norm": 1.0, "tokens_per_s": 341.3, "tokens_seen": 10240, "mfu": 0,
     "mem": 0, "time_s": 30.0},
    {"step": 20, "loss": 4.5, "lr": 2e-4, "grad_norm": 0.9, "tokens_per_s": 341.3, "tokens_seen": 20480, "mfu": 0,
     "mem": 0, "time_s": 60.0, "val_loss": 4.6, "val_ppl": 99.48},
    {"step": 25, "tokens_seen": 25600, "time_s": 75.0, "val_loss": 4.4, "val_ppl": 81.45},  # validation only
    {"step": 26, "skipped": True, "loss": 7.5},
    {"step": 30, "loss": 4.2, "lr": 3e-4, "grad_norm": 0.8, "tokens_per_s": 256.0, "tokens_seen": 30720, "mfu": 0,
     "mem": 0, "time_s": 100.0},
    "",  # blank lines are ignored
    # resumed from step 20
    {"step": 30, "loss": 4.1, "lr": 3e-4, "grad_norm": 0.8, "tokens_per_s": 256.0, "tokens_seen": 30720, "mfu": 0,
     "mem": 0, "time_s": 40.0},
    {"step": 40, "loss": 3.9, "lr": 3e-4, "grad_norm": 0.7, "tokens_per_s": 256.0, "tokens_seen": 40960, "mfu": 0,
     "mem": 0, "time_s": 80.0, "val_loss": 3.95, "val_ppl": 51.94},
    # resumed from step 40
    {"step": 50, "loss": 3.8, "lr": 3e-4, "grad_norm": 0.6, "tokens_per_s": 512.0, "tokens_seen": 51200, "mfu": 0,
     "mem": 0, "time_s": 20.0, "val_loss": 3.85, "val_ppl": 46.99},
]
# Cumulative wall-clock: 30 + 60 + 100, then 100 + 40, 100 + 80, then 180 + 20.
TRANSFORMER_VAL_TIME = [(60.0, 4.6), (75.0, 4.4), (180.0, 3.95), (200.0, 3.85)]
TRANSFORMER_TRAIN_TIME = [(30.0, 5.0), (60.0, 4.5), (100.0, 4.2), (140.0, 4.1), (180.0, 3.9), (200.0, 3.8)]
TRANSFORMER_VAL_TOKENS = [(20480, 4.6), (25600, 4.4), (40960, 3.95), (51200, 3.85)]
TRANSFORMER_TRAIN_TOKENS = [(10240, 5.0), (20480, 4.5), (30720, 4.1), (40960, 3.9), (51200, 3.8)]  # step 30: its redo

GLA_METRICS = [
    {"step": 10, "loss": 5.2, "tokens_seen": 10240, "time_s": 10.0, "val_loss": 5.1, "val_ppl": 164.0},
    {"step": 20, "loss": 4.8, "tokens_seen": 20480, "time_s": 20.0, "val_loss": 4.7, "val_ppl": 110.0},
    {"step": 30, "loss": 4.4, "tokens_seen": 30720, "time_s": 30.0, "val_loss": 4.3, "val_ppl": 73.7},
]


def lm_info(arch, non_embedding, state_bytes=None, seq_len=512):
    info = {"config": f"configs/compare/{arch}_30m.json", "arch": arch, "params": non_embedding + 4_194_304,
            "non_embedding_params": non_embedding, "device": "cpu", "micro_batch_tokens": 4096}
    if state_bytes is not None:
        info.update(decode_state_elements=state_bytes // 4,
                    decode_state_bytes={"per_sequence": state_bytes, "at_seq_len": seq_len})
    return info


def lm_eval(loss, ppl, tokens=123904):
    return {"checkpoint": "ckpt/step_1000.h5", "data": "data/brown.h5", "split": "val", "seq_len": 512,
            "tokens": tokens, "bytes": 4 * tokens, "loss": loss, "perplexity": ppl, "bits_per_byte": 1.2,
            "seconds": 1.5}


def lm_bench(tokens_per_s, peak_bytes, seq_len=512):
    return {"config": "configs/compare/x_30m.json", "device": "cpu", "precision": "fp32", "ranks": 1,
            "params": 34_000_000, "rows": [{"seq_len": seq_len, "batch": 8, "micro_batches": 1,
                                            "tokens_per_step": 8 * seq_len, "step_ms": 33.2,
                                            "tokens_per_s": tokens_per_s, "mfu": 0.3, "memory_bytes": 1 << 30,
                                            "peak_bytes": peak_bytes, "loss": 3.5}]}


def mqar_slice(seq_len, pairs, accuracy):
    return {"seq_len": seq_len, "pairs": pairs, "count": 100, "targets": 100 * pairs, "accuracy": accuracy,
            "loss": round(1 - accuracy, 3)}


def mqar_eval(pooled, slices):
    return {"checkpoint": "ckpt/step_2000.h5", "data": "mqar", "test_seed": 1234,
            "mqar": {"accuracy": pooled, "loss": round(1 - pooled, 3), "targets": sum(s["targets"] for s in slices),
                     "sequences": 100 * len(slices), "slices": slices}, "seconds": 0.2}


def mqar_info(mixer, width, non_embedding, state_bytes):
    return {"config": f"configs/mqar/{mixer}_d{width}.json", "arch": "mqar", "params": non_embedding + 8192 * width,
            "non_embedding_params": non_embedding, "decode_state_elements": state_bytes // 4,
            "decode_state_bytes": {"per_sequence": state_bytes, "at_seq_len": 256}}


def make_compare_out(out):
    """A compare.sh output directory under OUT."""
    lm = os.path.join(out, "lm")
    # transformer: complete, resumed twice
    d = os.path.join(lm, "transformer")
    write_jsonl(os.path.join(d, "metrics.jsonl"), TRANSFORMER_METRICS)
    write_json(os.path.join(d, "info.json"), lm_info("transformer", 29_876_543, state_bytes=4096))
    write_json(os.path.join(d, "eval.json"), lm_eval(3.45678, 31.7183))
    write_json(os.path.join(d, "bench.json"), lm_bench(123456.7, 1610612736))
    # gla: complete
    d = os.path.join(lm, "gla")
    write_jsonl(os.path.join(d, "metrics.jsonl"), GLA_METRICS)
    write_json(os.path.join(d, "info.json"), lm_info("gla", 30_100_000, state_bytes=1 << 20))
    write_json(os.path.join(d, "eval.json"), lm_eval(3.5, 33.1155))
    write_json(os.path.join(d, "bench.json"), lm_bench(250000.0, 2 << 30))
    # based: failed in training (compare.sh's error.txt), with a '|' that the Markdown table must escape
    d = os.path.join(lm, "based")
    write_jsonl(os.path.join(d, "metrics.jsonl"), GLA_METRICS[:1])
    write(os.path.join(d, "error.txt"), "CUDA error: out of memory | tried to allocate 2 GiB\n")
    # transnormer: eval.json malformed on line 3
    d = os.path.join(lm, "transnormer")
    write_json(os.path.join(d, "info.json"), lm_info("transnormer", 30_000_000, state_bytes=4096))
    write(os.path.join(d, "eval.json"), '{\n  "loss": 3.1,\n  oops\n}\n')
    write_json(os.path.join(d, "bench.json"), lm_bench(1000.0, 1 << 30))
    # latte: no bench.json
    d = os.path.join(lm, "latte")
    write_json(os.path.join(d, "info.json"), lm_info("latte", 30_000_000, state_bytes=4096))
    write_json(os.path.join(d, "eval.json"), lm_eval(3.6, 36.6))
    # transformer_vq: info.json of a linac without decode_state_bytes
    d = os.path.join(lm, "transformer_vq")
    write_json(os.path.join(d, "info.json"), lm_info("transformer_vq", 31_000_000))
    write_json(os.path.join(d, "eval.json"), lm_eval(3.3, 27.1126))
    write_json(os.path.join(d, "bench.json"), lm_bench(99000.4, 512 << 20))

    mqar = os.path.join(out, "mqar")
    # The hardest slice is (256, 16): the longest sequences, then the most pairs; (128, 32) has more
    # pairs and (256, 8) the same length. It is neither the first nor the last slice listed.
    runs = {
        "based_d64": (600_000, 2048, 0.75, [(64, 4, 0.99), (256, 16, 0.5), (128, 32, 0.6), (256, 8, 0.7)]),
        "based_d128": (2_400_000, 8192, 0.95, [(64, 4, 1.0), (128, 32, 0.9), (256, 16, 0.875), (256, 8, 0.95)]),
        "gla_d64": (700_000, 16384, 0.6, [(64, 4, 0.9), (128, 32, 0.4), (256, 8, 0.3)]),  # no (256, 16)
        "gla_d128": (2_800_000, 65536, 0.7, [(256, 16, 0.25), (64, 4, 0.97), (128, 32, 0.5), (256, 8, 0.45)]),
    }
    for name, (non_embedding, state, pooled, slices) in runs.items():
        mixer, width = name.rsplit("_d", 1)
        d = os.path.join(mqar, name)
        write_json(os.path.join(d, "info.json"), mqar_info(mixer, int(width), non_embedding, state))
        write_json(os.path.join(d, "eval.json"), mqar_eval(pooled, [mqar_slice(*s) for s in slices]))
    d = os.path.join(mqar, "attention_d64")  # failed
    write(os.path.join(d, "error.txt"), "no checkpoint in ckpt after training\n")
    d = os.path.join(mqar, "sliding_window_d64")  # info.json without non_embedding_params
    info = mqar_info("sliding_window", 64, 650_000, 4096)
    del info["non_embedding_params"]
    write_json(os.path.join(d, "info.json"), info)
    write_json(os.path.join(d, "eval.json"), mqar_eval(0.5, [mqar_slice(256, 16, 0.1)]))
    os.makedirs(os.path.join(mqar, "not_a_run_yet"))  # neither eval.json nor error.txt


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="linac_scripts_test_")
        self.tmp = self._tmp.name
        self.addCleanup(self._tmp.cleanup)

    def assert_error(self, proc, prog, *fragments, warnings=0):
        """Exit status 2 and one error line on stderr, 'PROG: error: ...' holding each fragment, after
        WARNINGS lines 'PROG: warning: ...'."""
        self.assertEqual(proc.returncode, 2, f"stdout: {proc.stdout!r}\nstderr: {proc.stderr!r}")
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), warnings + 1, f"stderr: {proc.stderr!r}")
        for line in lines[:-1]:
            self.assertTrue(line.startswith(f"{prog}: warning: "), line)
        self.assertTrue(lines[-1].startswith(f"{prog}: error: "), lines[-1])
        for fragment in fragments:
            self.assertIn(fragment, lines[-1])

    def assert_ok(self, proc):
        self.assertEqual(proc.returncode, 0, f"stdout: {proc.stdout!r}\nstderr: {proc.stderr!r}")
