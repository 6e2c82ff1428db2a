#!/usr/bin/env python3
"""Tests of scripts/compare_table.py (CTest: scripts.compare_table, label cpu): the rows, the hardest
slice, failed and broken runs, the Markdown, on a fake compare.sh output directory (fixtures.py).
compare_table.py is standard library only: it runs under `python -S` (no site-packages).

  python3 tests/scripts/test_compare_table.py [-v] [unittest options]
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
from fixtures import *  # noqa: E402,F401,F403  (the fake compare.sh output and the helpers)


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


def row_key(r):
    return (r["kind"], r["arch"], r.get("width"))


class CompareTableKeepTest(TempDirTest):
    """--keep: an earlier compare.json's rows stay where OUT_DIR has no run of the same kind,
    arch and width; OUT_DIR's runs replace theirs; the hardest slice is taken over both."""

    def test_keep_merges_and_replaces(self):
        make_compare_out(self.tmp)
        self.assert_ok(run(sys.executable, "compare_table.py", self.tmp))
        with open(os.path.join(self.tmp, "compare.json"), encoding="utf-8") as f:
            fresh = json.load(f)
        old = [{"kind": "lm", "arch": "latte_macchiato", "val_loss": 5.0, "val_ppl": 148.4,
                "non_embedding_params": 30e6, "tokens_per_s": 1e5, "peak_memory_bytes": 2**30,
                "decode_state_bytes_per_sequence": None, "decode_state_at_seq_len": None,
                "decode_state_bytes_per_token_of_context": None},
               {"kind": "mqar", "arch": "transformer_vq", "width": 256, "non_embedding_params": 5e4,
                "mqar_accuracy_pooled": 0.25, "mqar_slices": [{"seq_len": 4096, "pairs": 8, "accuracy": 0.5}],
                "decode_state_bytes_per_sequence": 1024, "decode_state_at_seq_len": 1024}]
        stale = dict(fresh[0], val_loss=99.0)  # a row OUT_DIR has a run for: replaced
        keep = os.path.join(self.tmp, "earlier.json")
        write_json(keep, old + [stale])
        self.assert_ok(run(sys.executable, "compare_table.py", self.tmp, "--keep", keep))
        with open(os.path.join(self.tmp, "compare.json"), encoding="utf-8") as f:
            rows = json.load(f)
        self.assertEqual(len(rows), len(fresh) + 2)
        same = [r for r in rows if row_key(r) == row_key(fresh[0])]
        self.assertEqual(same, [fresh[0]])
        lm_archs = [r["arch"] for r in rows if r["kind"] == "lm"]
        self.assertLess(lm_archs.index("latte_macchiato"), lm_archs.index("transformer_vq"))  # the usual order
        kept = [r for r in rows if r["kind"] == "mqar" and r.get("width") == 256]
        self.assertEqual(len(kept), 1)
        # the kept row's slice is longer than any fresh one: it is now the hardest, for every row
        self.assertEqual(kept[0]["mqar_hardest_slice"], {"seq_len": 4096, "pairs": 8})
        self.assertEqual(kept[0]["mqar_accuracy_hardest"], 0.5)
        self.assertTrue(all(r["mqar_accuracy_hardest"] is None for r in rows if r["kind"] == "mqar" and
                            r.get("width") != 256 and "error" not in r))

    def test_keep_bad_file(self):
        make_compare_out(self.tmp)
        bad = os.path.join(self.tmp, "bad.json")
        write(bad, '{"kind": "lm"}')
        self.assert_error(run(sys.executable, "compare_table.py", self.tmp, "--keep", bad), "compare_table.py",
                          f"--keep {bad}: expected a list of rows")
        self.assert_error(run(sys.executable, "compare_table.py", self.tmp, "--keep", bad + ".missing"),
                          "compare_table.py", "--keep")


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


if __name__ == "__main__":
    unittest.main()
