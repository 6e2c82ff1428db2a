#!/usr/bin/env python3
"""Tests of scripts/plot_runs.py and scripts/plot_mqar.py (CTest: scripts.plots, label cpu). Their
error cases exit before matplotlib is imported and run with any Python; the cases that draw a
figure need a Python with matplotlib (fixtures.py says which) and are skipped without one.

  python3 tests/scripts/test_plots.py [-v] [unittest options]
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from fixtures import *  # noqa: E402,F401,F403  (the fake compare.sh output and the helpers)


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
