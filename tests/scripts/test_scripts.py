#!/usr/bin/env python3
"""Tests of scripts/compare_table.py, scripts/plot_runs.py and scripts/plot_mqar.py (CTest: scripts.python, label cpu).

  python3 tests/scripts/test_scripts.py [-v] [unittest options]

Builds a fake output directory of scripts/compare.sh in a temporary directory (lm/<arch>/ and
mqar/<mixer>_d<width>/ with the files `linac train/eval/info/bench` write, some runs failed or
broken) and runs the scripts on it through subprocess. compare_table.py is standard library only:
it runs under `python -S` (no site-packages). The plotting scripts' error cases exit before they
import matplotlib and run with any Python; the cases that draw a figure run with the first of this
interpreter and /usr/bin/python3 that has matplotlib (LINAC_PLOT_PYTHON=PATH names the only one to
try, LINAC_PLOT_PYTHON= none), and are skipped when none has it (Debian: python3-matplotlib).
"""
import ast
import importlib.util
import json
import os
import re
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


def run(python, name, *args, flags=()):
    """Runs scripts/NAME with PYTHON; the CompletedProcess (text stdout and stderr)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    env.pop("PYTHONPATH", None)
    return subprocess.run([python, *flags, script(name), *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


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


# ---- compare_table.py ----

class CompareTableTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="linac_compare_table_test_")
        cls.out = cls._tmp.name
        make_compare_out(cls.out)
        # -S: no site-packages, so only the standard library can be imported
        cls.proc = run(sys.executable, "compare_table.py", cls.out, flags=("-S",))
        if cls.proc.returncode == 0:
            with open(os.path.join(cls.out, "compare.json"), encoding="utf-8") as f:
                cls.rows = json.load(f)
            with open(os.path.join(cls.out, "compare.md"), encoding="utf-8") as f:
                cls.md = f.read()

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def setUp(self):
        self.assertEqual(self.proc.returncode, 0, f"compare_table.py failed: {self.proc.stderr}")

    def row(self, kind, arch, width=None):
        found = [r for r in self.rows if r["kind"] == kind and r["arch"] == arch and r.get("width") == width]
        self.assertEqual(len(found), 1, f"{kind} {arch} {width}: {len(found)} rows")
        return found[0]

    def md_line(self, section, prefix):
        """The one line starting with PREFIX in compare.md's section 'lm' or 'mqar'."""
        lm, mqar = self.md.split("## MQAR")
        found = [line for line in (lm if section == "lm" else mqar).splitlines() if line.startswith(prefix)]
        self.assertEqual(len(found), 1, f"lines starting with {prefix!r} in compare.md:\n{self.md}")
        return found[0]

    def test_runs_with_the_standard_library_only(self):
        # the run above used python -S; also no import outside the standard library in the source
        self.assertEqual(self.proc.stderr, "")
        self.assertIn("(6 LM rows, 7 MQAR rows)", self.proc.stdout)
        stdlib = getattr(sys, "stdlib_module_names", None)
        if stdlib is None:
            self.skipTest("sys.stdlib_module_names needs Python 3.10")
        with open(script("compare_table.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                self.assertIn(name.split(".")[0], stdlib, f"compare_table.py imports {name}")

    def test_row_order(self):
        self.assertEqual([(r["kind"], r["arch"], r.get("width")) for r in self.rows],
                         [("lm", "transformer", None), ("lm", "gla", None), ("lm", "based", None),
                          ("lm", "transnormer", None), ("lm", "latte", None), ("lm", "transformer_vq", None),
                          ("mqar", "attention", 64), ("mqar", "sliding_window", 64), ("mqar", "based", 64),
                          ("mqar", "based", 128), ("mqar", "gla", 64), ("mqar", "gla", 128),
                          ("mqar", "not_a_run_yet", None)])

    def test_lm_row(self):
        r = self.row("lm", "transformer")
        self.assertNotIn("error", r)
        self.assertEqual(r["run_dir"], os.path.join(self.out, "lm", "transformer"))
        self.assertEqual(r["config"], "configs/compare/transformer_30m.json")
        self.assertEqual(r["params"], 29_876_543 + 4_194_304)
        self.assertEqual(r["non_embedding_params"], 29_876_543)
        self.assertEqual(r["val_loss"], 3.45678)
        self.assertEqual(r["val_ppl"], 31.7183)
        self.assertEqual(r["val_tokens"], 123904)
        self.assertEqual(r["tokens_per_s"], 123456.7)
        self.assertEqual(r["peak_memory_bytes"], 1610612736)
        self.assertEqual(r["bench_seq_len"], 512)

    def test_decode_state_per_token(self):
        r = self.row("lm", "transformer")
        self.assertEqual(r["decode_state_bytes_per_sequence"], 4096)
        self.assertEqual(r["decode_state_at_seq_len"], 512)
        self.assertEqual(r["decode_state_bytes_per_token_of_context"], 8.0)  # per_sequence / at_seq_len
        self.assertEqual(self.row("lm", "gla")["decode_state_bytes_per_token_of_context"], 2048.0)
        self.assertEqual(self.row("mqar", "gla", 128)["decode_state_bytes_per_token_of_context"], 256.0)
        r = self.row("lm", "transformer_vq")  # info.json without decode_state_bytes
        self.assertNotIn("error", r)
        for key in ("decode_state_bytes_per_sequence", "decode_state_at_seq_len",
                    "decode_state_bytes_per_token_of_context"):
            self.assertIsNone(r[key], key)

    def test_failed_lm_runs(self):
        self.assertEqual(self.row("lm", "based")["error"], "CUDA error: out of memory | tried to allocate 2 GiB")
        self.assertNotIn("val_loss", self.row("lm", "based"))
        self.assertEqual(self.row("lm", "latte")["error"], "no bench.json")
        eval_path = os.path.join(self.out, "lm", "transnormer", "eval.json")
        self.assertTrue(self.row("lm", "transnormer")["error"].startswith(f"{eval_path}:3: malformed JSON ("),
                        self.row("lm", "transnormer")["error"])

    def test_failed_mqar_runs(self):
        r = self.row("mqar", "attention", 64)
        self.assertEqual(r["error"], "no checkpoint in ckpt after training")
        self.assertNotIn("mqar_accuracy_hardest", r)
        info_path = os.path.join(self.out, "mqar", "sliding_window_d64", "info.json")
        self.assertEqual(self.row("mqar", "sliding_window", 64)["error"], f"{info_path}: no non_embedding_params")

    def test_mqar_hardest_slice(self):
        for width, hardest, pooled in ((64, 0.5, 0.75), (128, 0.875, 0.95)):
            r = self.row("mqar", "based", width)
            self.assertNotIn("error", r)
            self.assertEqual(r["mqar_hardest_slice"], {"seq_len": 256, "pairs": 16})
            self.assertEqual(r["mqar_accuracy_hardest"], hardest)
            self.assertEqual(r["mqar_accuracy_pooled"], pooled)
            self.assertEqual(len(r["mqar_slices"]), 4)
        self.assertEqual(self.row("mqar", "gla", 128)["mqar_accuracy_hardest"], 0.25)
        self.assertEqual(self.row("mqar", "based", 128)["mqar_loss"], 0.05)
        self.assertEqual(self.row("mqar", "based", 128)["decode_state_bytes_per_sequence"], 8192)

    def test_mqar_row_without_the_hardest_slice(self):
        r = self.row("mqar", "gla", 64)
        self.assertNotIn("error", r)
        self.assertEqual(r["mqar_hardest_slice"], {"seq_len": 256, "pairs": 16})
        self.assertIsNone(r["mqar_accuracy_hardest"])
        self.assertEqual(r["mqar_accuracy_pooled"], 0.6)

    def test_markdown_lm_table(self):
        self.assertIn("## Language modelling", self.md)
        self.assertEqual(self.md_line("lm", "| arch |"), "| arch | non-embedding params | val loss | val ppl | tokens/s | "
                                                   "peak memory | decode state | state / context token |")
        self.assertEqual(self.md_line("lm", "| transformer |"),
                         "| transformer | 29.88M | 3.4568 | 31.72 | 123,457 | 1.5 GiB | 4 KiB at T=512 | 8 B |")
        self.assertEqual(self.md_line("lm", "| gla |"),
                         "| gla | 30.1M | 3.5000 | 33.12 | 250,000 | 2 GiB | 1 MiB at T=512 | 2 KiB |")
        self.assertEqual(self.md_line("lm", "| transformer_vq |"),
                         "| transformer_vq | 31M | 3.3000 | 27.11 | 99,000 | 512 MiB | — | — |")
        self.assertEqual(self.md_line("lm", "| based |"),
                         "| based | failed: CUDA error: out of memory \\| tried to allocate 2 GiB |  |  |  |  |  |  |")
        self.assertEqual(self.md_line("lm", "| latte |"), "| latte | failed: no bench.json |  |  |  |  |  |  |")
        self.assertIn(":3: malformed JSON (", self.md_line("lm", "| transnormer | failed: "))

    def test_markdown_mqar_table(self):
        self.assertIn("## MQAR", self.md)
        self.assertIn("Accuracy on the hardest slice (seq_len 256, 16 pairs) and over all test sequences (pooled).",
                      self.md.splitlines())
        self.assertEqual(self.md_line("mqar", "| mixer |"), "| mixer | width | non-embedding params | "
                                                    "accuracy (seq_len 256, 16 pairs) | pooled accuracy | state |")
        self.assertEqual(self.md_line("mqar", "| based | 64 |"), "| based | 64 | 600K | 50.0% | 75.0% | 2 KiB at T=256 |")
        self.assertEqual(self.md_line("mqar", "| based | 128 |"), "| based | 128 | 2.4M | 87.5% | 95.0% | 8 KiB at T=256 |")
        self.assertEqual(self.md_line("mqar", "| gla | 64 |"), "| gla | 64 | 700K | — | 60.0% | 16 KiB at T=256 |")
        self.assertEqual(self.md_line("mqar", "| gla | 128 |"), "| gla | 128 | 2.8M | 25.0% | 70.0% | 64 KiB at T=256 |")
        self.assertEqual(self.md_line("mqar", "| attention d64 |"),
                         "| attention d64 | failed: no checkpoint in ckpt after training |  |  |  |  |")
        self.assertIn("no non_embedding_params", self.md_line("mqar", "| sliding_window d64 | failed: "))
        # a run directory without error.txt or any result (compare.sh interrupted): failed, listed last
        self.assertEqual(self.md.splitlines()[-1], "| not_a_run_yet | failed: no info.json |  |  |  |  |")

    def test_markdown_cell_counts(self):
        # the LM table comes first; each row of a table has its header's number of cells ('\\|' is no separator)
        lm, mqar = self.md.split("## MQAR")
        self.assertIn("## Language modelling", lm)
        for section, cells, rows in ((lm, 8, 6), (mqar, 6, 7)):
            lines = [line for line in section.splitlines() if line.startswith("|")]
            self.assertEqual(len(lines), 2 + rows)
            for line in lines:
                self.assertEqual(len(re.split(r"(?<!\\)\|", line)) - 2, cells, line)


class CompareTableOnlyOneKindTest(TempDirTest):
    def test_mqar_only(self):
        make_compare_out(self.tmp)
        for name in os.listdir(os.path.join(self.tmp, "lm")):
            d = os.path.join(self.tmp, "lm", name)
            for f in os.listdir(d):
                os.remove(os.path.join(d, f))
            os.rmdir(d)
        self.assert_ok(run(sys.executable, "compare_table.py", self.tmp))
        with open(os.path.join(self.tmp, "compare.md"), encoding="utf-8") as f:
            md = f.read()
        self.assertNotIn("## Language modelling", md)
        self.assertIn("## MQAR", md)

    def test_no_runs(self):
        os.makedirs(os.path.join(self.tmp, "lm"))
        self.assert_error(run(sys.executable, "compare_table.py", self.tmp), "compare_table.py",
                          f"{self.tmp}: no run directories under lm/ or mqar/")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "compare.json")))

    def test_missing_out_dir(self):
        missing = os.path.join(self.tmp, "missing")
        self.assert_error(run(sys.executable, "compare_table.py", missing), "compare_table.py", missing)


class CompareTableHelpersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ct = load_script("compare_table")

    def test_hardest_slice(self):
        rows = [{"mqar_slices": [mqar_slice(512, 4, 0.1), mqar_slice(128, 64, 0.2)]},
                {"mqar_slices": [mqar_slice(512, 8, 0.3), mqar_slice(256, 128, 0.4)]}, {"error": "x"}]
        self.assertEqual(self.ct.hardest_slice(rows), (512, 8))
        self.assertIsNone(self.ct.hardest_slice([{"error": "x"}]))
        self.assertEqual(self.ct.slice_accuracy(rows[1], (512, 8)), 0.3)
        self.assertIsNone(self.ct.slice_accuracy(rows[0], (512, 8)))

    def test_rank(self):
        names = ["transformer", "gla", "based"]
        self.assertEqual(sorted(["zeta", "based", "alpha", "transformer"], key=lambda n: self.ct.rank(names, n)),
                         ["transformer", "based", "alpha", "zeta"])

    def test_sizes_and_counts(self):
        self.assertEqual(self.ct.size(None), "—")
        self.assertEqual(self.ct.size(1023), "1023 B")
        self.assertEqual(self.ct.size(1536), "1.5 KiB")
        self.assertEqual(self.ct.size(3 << 40), "3 TiB")
        self.assertEqual(self.ct.size(5 << 50), "5120 TiB")
        self.assertEqual(self.ct.count(999), "999")
        self.assertEqual(self.ct.count(125_000_000), "125M")
        self.assertEqual(self.ct.count(1_500_000_000), "1.5B")


# ---- plot_runs.py ----

class PlotRunsLoadTest(TempDirTest):
    """load_run() and read_jsonl() directly: module level imports no matplotlib."""

    @classmethod
    def setUpClass(cls):
        cls.pr = load_script("plot_runs")

    def test_cumulative_wall_clock_across_resumes(self):
        d = os.path.join(self.tmp, "transformer")
        write_jsonl(os.path.join(d, "metrics.jsonl"), TRANSFORMER_METRICS)
        run_ = self.pr.load_run(d)
        self.assertEqual(run_["val"]["time"], TRANSFORMER_VAL_TIME)
        self.assertEqual(run_["train"]["time"], TRANSFORMER_TRAIN_TIME)

    def test_redone_step_keeps_its_last_record(self):
        d = os.path.join(self.tmp, "transformer")
        write_jsonl(os.path.join(d, "metrics.jsonl"), TRANSFORMER_METRICS)
        run_ = self.pr.load_run(d)
        self.assertEqual(run_["val"]["tokens"], TRANSFORMER_VAL_TOKENS)
        self.assertEqual(run_["train"]["tokens"], TRANSFORMER_TRAIN_TOKENS)

    def test_skipped_records_left_out(self):
        path = os.path.join(self.tmp, "metrics.jsonl")
        write_jsonl(path, TRANSFORMER_METRICS)
        records = self.pr.read_jsonl(path)
        self.assertEqual(len(records), 7)  # 9 lines: one blank, one skipped
        self.assertFalse(any(r.get("skipped") for r in records))
        self.assertEqual([r["step"] for r in records], [10, 20, 25, 30, 30, 40, 50])

    def test_val_line_without_tokens_seen_takes_its_steps(self):
        # older metrics files: a validation line with neither tokens_seen nor time_s after the step's train line
        d = os.path.join(self.tmp, "old")
        write_jsonl(os.path.join(d, "metrics.jsonl"), [{"step": 10, "loss": 5.0, "tokens_seen": 1000, "time_s": 3.0},
                                                       {"step": 10, "val_loss": 4.9},
                                                       {"step": 20, "val_loss": 4.5}])
        run_ = self.pr.load_run(d)
        self.assertEqual(run_["val"]["tokens"], [(1000, 4.9)])
        self.assertEqual(run_["val"]["time"], [])
        self.assertEqual(run_["train"]["time"], [(3.0, 5.0)])

    def test_mqar_accuracy_metric(self):
        # an MQAR run's validation lines carry val_accuracy next to val_loss
        d = os.path.join(self.tmp, "mqar")
        write_jsonl(os.path.join(d, "metrics.jsonl"), [
            {"step": 10, "loss": 5.0, "tokens_seen": 1000, "time_s": 2.0},
            {"step": 20, "loss": 4.0, "tokens_seen": 2000, "time_s": 4.0, "val_loss": 3.5, "val_accuracy": 0.25},
            {"step": 30, "tokens_seen": 3000, "time_s": 6.5, "val_loss": 2.5, "val_accuracy": 0.75}])
        run_ = self.pr.load_run(d, "val_accuracy")
        self.assertEqual(run_["val"]["tokens"], [(2000, 0.25), (3000, 0.75)])
        self.assertEqual(run_["val"]["time"], [(4.0, 0.25), (6.5, 0.75)])
        self.assertEqual(self.pr.load_run(d)["val"]["tokens"], [(2000, 3.5), (3000, 2.5)])

    def test_time_unit(self):
        self.assertEqual(self.pr.time_unit(100), (1.0, "s"))
        self.assertEqual(self.pr.time_unit(200), (60.0, "min"))
        self.assertEqual(self.pr.time_unit(3 * 3600), (3600.0, "h"))


class PlotRunsErrorTest(TempDirTest):
    """Errors come before matplotlib is imported: any Python runs them."""

    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.tmp, "run")
        self.metrics = os.path.join(self.run_dir, "metrics.jsonl")
        write_jsonl(self.metrics, GLA_METRICS)
        self.png = os.path.join(self.tmp, "out.png")

    def plot(self, *args, python=None, flags=()):
        return run(python or sys.executable, "plot_runs.py", *args, flags=flags)

    def test_missing_metrics_jsonl(self):
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty)
        self.assert_error(self.plot(self.run_dir, empty, "--out", self.png), "plot_runs.py",
                          f"{empty}: no metrics.jsonl")
        self.assertFalse(os.path.exists(self.png))

    def test_missing_run_dir(self):
        missing = os.path.join(self.tmp, "missing")
        self.assert_error(self.plot(missing, "--out", self.png), "plot_runs.py", f"{missing}: no such run directory")

    def test_malformed_line_names_file_and_line(self):
        write_jsonl(self.metrics, GLA_METRICS[:2] + ['{"step": 30, "loss": 4.4,'] + GLA_METRICS[2:])
        self.assert_error(self.plot(self.run_dir, "--out", self.png), "plot_runs.py",
                          f"{self.metrics}:3: malformed JSON line (")

    def test_line_not_an_object(self):
        write_jsonl(self.metrics, GLA_METRICS + ["", "[1, 2]"])
        self.assert_error(self.plot(self.run_dir, "--out", self.png), "plot_runs.py",
                          f"{self.metrics}:5: a metrics line must be a JSON object")

    def test_no_val_loss(self):
        write_jsonl(self.metrics, [{"step": 10, "loss": 5.0, "tokens_seen": 1000, "time_s": 1.0}])
        self.assert_error(self.plot(self.run_dir, "--out", self.png), "plot_runs.py",
                          f"{self.metrics}: no val_loss record")

    def test_metric_missing_or_with_train_loss(self):
        write_jsonl(self.metrics, GLA_METRICS)
        self.assert_error(self.plot(self.run_dir, "--out", self.png, "--metric", "val_accuracy"), "plot_runs.py",
                          f"{self.metrics}: no val_accuracy record")
        self.assert_error(self.plot(self.run_dir, "--out", self.png, "--metric", "val_ppl", "--train-loss"),
                          "plot_runs.py", "--train-loss draws losses: it goes with --metric val_loss, not val_ppl")

    def test_unknown_out_extension(self):
        for out in ("out.pdf", "out"):
            with self.subTest(out=out):
                path = os.path.join(self.tmp, out)
                self.assert_error(self.plot(self.run_dir, "--out", path), "plot_runs.py",
                                  f"--out {path}: unknown extension (use .png or .svg)")
                self.assertFalse(os.path.exists(path))

    def test_labels_count(self):
        self.assert_error(self.plot(self.run_dir, self.run_dir, "--labels", "a,b,c", "--out", self.png),
                          "plot_runs.py", "--labels has 3 names for 2 runs")

    def test_without_matplotlib(self):
        if has_matplotlib(sys.executable, "-S"):
            self.skipTest(f"{sys.executable} -S still imports matplotlib")
        self.assert_error(self.plot(self.run_dir, "--out", self.png, flags=("-S",)), "plot_runs.py",
                          "matplotlib is not installed")


@NEEDS_MATPLOTLIB
class PlotRunsImageTest(TempDirTest):
    def setUp(self):
        super().setUp()
        make_compare_out(self.tmp)
        self.runs = [os.path.join(self.tmp, "lm", a) for a in ("transformer", "gla")]

    def test_png_as_compare_sh_draws_it(self):
        out = os.path.join(self.tmp, "lm_loss.png")
        proc = run(PLOT_PY, "plot_runs.py", *self.runs, "--out", out, "--train-loss",
                   "--title", "~30M non-embedding parameters, brown.h5, T = 512")
        self.assert_ok(proc)
        self.assertEqual(proc.stdout.strip(), f"wrote {out}")
        with open(out, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], PNG_SIGNATURE)
        self.assertGreater(len(data), 10_000)

    def test_svg_texts(self):
        out = os.path.join(self.tmp, "loss.svg")
        self.assert_ok(run(PLOT_PY, "plot_runs.py", *self.runs, "--out", out, "--labels", "tf-run,gla-run",
                           "--title", "two runs", "--train-loss"))
        with open(out, encoding="utf-8") as f:
            svg = f.read()
        self.assertTrue(svg.startswith("<?xml") or "<svg" in svg, svg[:200])
        texts = svg_texts(out)
        for text in ("tf-run", "gla-run", "two runs", "training loss (faint)", "tokens seen (millions)",
                     "validation loss (nats/token)"):
            self.assertIn(text, texts)
        # the transformer run's wall-clock is cumulative across its two resumes: 200 s in all, so
        # minutes; its time_s values alone never exceed 100 s
        self.assertIn("wall-clock time (min)", texts)

    def test_other_metric_labels_its_axis(self):
        out = os.path.join(self.tmp, "ppl.svg")
        self.assert_ok(run(PLOT_PY, "plot_runs.py", self.runs[1], "--out", out, "--metric", "val_ppl"))
        texts = svg_texts(out)
        self.assertIn("validation perplexity", texts)
        self.assertNotIn("validation loss (nats/token)", texts)

    def test_seconds_without_resumes(self):
        out = os.path.join(self.tmp, "gla.svg")
        self.assert_ok(run(PLOT_PY, "plot_runs.py", self.runs[1], "--out", out))
        texts = svg_texts(out)
        self.assertIn("wall-clock time (s)", texts)
        self.assertIn("gla", texts)  # the directory name labels the run
        self.assertNotIn("training loss (faint)", texts)

    def test_unwritable_out(self):
        out = os.path.join(self.tmp, "no", "such", "dir", "x.png")
        self.assert_error(run(PLOT_PY, "plot_runs.py", self.runs[1], "--out", out), "plot_runs.py",
                          f"cannot write {out}")


# ---- plot_mqar.py ----

class PlotMqarErrorTest(TempDirTest):
    """Errors come before matplotlib is imported: any Python runs them."""

    def setUp(self):
        super().setUp()
        make_compare_out(self.tmp)
        self.mqar = os.path.join(self.tmp, "mqar")
        self.png = os.path.join(self.tmp, "mqar.png")

    def plot(self, *args):
        return run(sys.executable, "plot_mqar.py", *args)

    def test_unknown_out_extension(self):
        out = os.path.join(self.tmp, "mqar.jpg")
        self.assert_error(self.plot(self.mqar, "--out", out), "plot_mqar.py",
                          f"--out {out}: unknown extension (use .png or .svg)")

    def test_bad_slice(self):
        for text in ("256", "256,x", "1,2,3", "hardest"):
            with self.subTest(slice=text):
                self.assert_error(self.plot(self.mqar, "--out", self.png, "--slice", text), "plot_mqar.py",
                                  f"--slice {text}: expected L,P (two integers) or pooled")

    def test_slice_nobody_has(self):
        self.assert_error(self.plot(self.mqar, "--out", self.png, "--slice", "512,4"), "plot_mqar.py",
                          "--slice 512,4: no result has it (present: 64,4 128,32 256,8 256,16)",
                          warnings=2)  # attention d64 and sliding_window d64 failed

    def test_missing_results(self):
        missing = os.path.join(self.tmp, "missing.json")
        self.assert_error(self.plot(missing, "--out", self.png), "plot_mqar.py",
                          f"{missing}: no such file or directory")

    def test_malformed_compare_json_names_file_and_line(self):
        path = os.path.join(self.tmp, "compare.json")
        write(path, '[\n  {"kind": "mqar"},\n  {"kind": \n]\n')
        self.assert_error(self.plot(path, "--out", self.png), "plot_mqar.py", f"{path}:4: malformed JSON (")

    def test_compare_json_not_a_list(self):
        path = os.path.join(self.tmp, "compare.json")
        write_json(path, {"rows": []})
        self.assert_error(self.plot(path, "--out", self.png), "plot_mqar.py", f"{path}: expected a list of rows")

    def test_no_mqar_rows(self):
        path = os.path.join(self.tmp, "compare.json")
        write_json(path, [{"kind": "lm", "arch": "gla"}])
        self.assert_error(self.plot(path, "--out", self.png), "plot_mqar.py", f"no MQAR results in {path}")

    def test_directory_without_runs(self):
        # OUT itself, not OUT/mqar: lm/ and mqar/ hold no eval.json
        self.assert_error(self.plot(self.tmp, "--out", self.png), "plot_mqar.py",
                          f"{self.tmp}: no run directories holding eval.json")

    def test_only_failed_runs(self):
        d = os.path.join(self.tmp, "failed_only")
        write(os.path.join(d, "attention_d64", "error.txt"), "boom\n")
        proc = self.plot(d, "--out", self.png)
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr.splitlines(),
                         ["plot_mqar.py: warning: attention d64: failed (boom); left out",
                          f"plot_mqar.py: error: no MQAR results in {d}"])


@NEEDS_MATPLOTLIB
class PlotMqarImageTest(TempDirTest):
    @classmethod
    def setUpClass(cls):
        cls._out = tempfile.TemporaryDirectory(prefix="linac_plot_mqar_test_")
        cls.out = cls._out.name
        make_compare_out(cls.out)
        cls.compare_json = os.path.join(cls.out, "compare.json")
        proc = run(sys.executable, "compare_table.py", cls.out)
        assert proc.returncode == 0, proc.stderr

    @classmethod
    def tearDownClass(cls):
        cls._out.cleanup()

    def test_png_from_run_directories(self):
        out = os.path.join(self.tmp, "mqar.png")
        proc = run(PLOT_PY, "plot_mqar.py", os.path.join(self.out, "mqar"), "--out", out)
        self.assert_ok(proc)
        with open(out, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], PNG_SIGNATURE)
        self.assertGreater(len(data), 10_000)
        warnings = proc.stderr.splitlines()
        self.assertIn("plot_mqar.py: warning: attention d64: failed (no checkpoint in ckpt after training); left out",
                      warnings)
        self.assertIn("plot_mqar.py: warning: gla d64: no slice seq_len 256, 16 pairs; left out", warnings)
        self.assertTrue(any(w.startswith("plot_mqar.py: warning: sliding_window d64: failed (") for w in warnings),
                        warnings)
        self.assertEqual(len(warnings), 3, warnings)

    def test_svg_from_compare_json_hardest_slice(self):
        out = os.path.join(self.tmp, "mqar.svg")
        proc = run(PLOT_PY, "plot_mqar.py", self.compare_json, "--out", out)
        self.assert_ok(proc)
        with open(out, encoding="utf-8") as f:
            svg = f.read()
        self.assertTrue(svg.startswith("<?xml") or "<svg" in svg, svg[:200])
        texts = svg_texts(out)
        self.assertIn("MQAR, sequence length 256, 16 key-value pairs", texts)
        self.assertIn("state size (bytes)", texts)
        self.assertIn("MQAR accuracy", texts)
        self.assertIn("based", texts)
        self.assertIn("gla", texts)
        self.assertIn("d128", texts)
        self.assertNotIn("attention", texts)  # failed
        self.assertNotIn("sliding_window", texts)  # broken info.json

    def test_slices(self):
        for slice_, title in (("pooled", "MQAR, all test sequences"),
                              ("64,4", "MQAR, sequence length 64, 4 key-value pairs")):
            with self.subTest(slice=slice_):
                out = os.path.join(self.tmp, f"mqar_{slice_.replace(',', '_')}.svg")
                proc = run(PLOT_PY, "plot_mqar.py", self.compare_json, "--out", out, "--slice", slice_)
                self.assert_ok(proc)
                self.assertNotIn("gla d64", proc.stderr)  # it has this slice
                self.assertIn(title, svg_texts(out))

    def test_title_option(self):
        out = os.path.join(self.tmp, "titled.svg")
        self.assert_ok(run(PLOT_PY, "plot_mqar.py", self.compare_json, "--out", out, "--title", "Figure 2"))
        texts = svg_texts(out)
        self.assertIn("Figure 2", texts)
        self.assertNotIn("MQAR, sequence length 256, 16 key-value pairs", texts)


if __name__ == "__main__":
    unittest.main()
