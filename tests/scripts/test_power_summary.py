#!/usr/bin/env python3
"""scripts/power_summary.py on hand-made nvidia-smi samples: only the samples drawing at least half
the limit count, the clock is read under either name nvidia-smi gives it, repeated headers and a
cut-off last line are skipped, the share near the limit and with the power cap active and the
clock's median and percentiles come out of those samples; samples without the needed columns or
with none under load, or no file, get one line and exit status 2.
"""
import sys
import unittest

from fixtures import run, run_on_text

# As nvidia-smi writes it for --query-gpu=power.draw,power.limit,clocks.sm,clocks_event_reasons.sw_power_cap
HEADER = "power.draw [W], power.limit [W], clocks.current.sm [MHz], clocks_event_reasons.sw_power_cap"


class PowerSummary(unittest.TestCase):
    def run_on(self, text):
        return run_on_text("power_summary.py", text)

    def test_loaded_samples_only(self):
        lines = [HEADER, "85.3, 700.00, 345, Not Active",  # idle: left out
                 "690.1, 700.00, 1500, Active", "699.0, 700.00, 1550, Active", "610.0, 700.00, 1800, Not Active",
                 HEADER, "700.5, 700.00, 1520, Active", "402.2, 700.00, 1900, Not Active", "650.0, 7"]
        r = self.run_on("\n".join(lines) + "\n")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip(),
                         "power: 5 samples under load, draw 690 W of 700 W (median), 60% within 5% of the limit, "
                         "power cap active in 60%; SM clock 1550 MHz (median; p10 1500, p90 1900)")

    def test_without_the_cap_column(self):
        r = self.run_on("power.draw [W], power.limit [W], clocks.sm [MHz]\n500.0, 700.0, 1700\n")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("power cap", r.stdout)
        self.assertIn("1 samples under load, draw 500 W of 700 W", r.stdout)

    def test_nothing_to_summarise(self):
        r = self.run_on(HEADER + "\n100.0, 700.0, 1980, Not Active\n")
        self.assertEqual((r.returncode, len(r.stdout.splitlines())), (2, 1))
        self.assertIn("no sample under load", r.stdout)
        r = self.run_on("power.draw [W], clocks.sm [MHz]\n600.0, 1700\n")
        self.assertEqual((r.returncode, len(r.stdout.splitlines())), (2, 1))
        self.assertIn("no power.limit column", r.stdout)
        r = run(sys.executable, "power_summary.py", "/nonexistent/smi.csv")
        self.assertEqual((r.returncode, len(r.stdout.splitlines())), (2, 1))
        self.assertIn("cannot read /nonexistent/smi.csv", r.stdout)


if __name__ == "__main__":
    unittest.main()
