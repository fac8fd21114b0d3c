"""The sweep-and-review demo's parts without the cluster: the sweep's runs, the reference
checker, the launch (against the fake scheduler) and real review agents in real sandboxes
talking to the scripted stand-in model through the metering proxy.

The model is scripted: the agreement here checks the plumbing, not a model's quality.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


from demo.reference_checker import SCRIPTED_CAVEAT, agreement, check_file, check_run

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-tco-review-unit-9e2"
REFERENCE = ["ok", "ok", "bad", "ok", "bad", "bad", "ok", "bad"]
REASONS = ["ok", "ok", "diverged", "ok", "crashed", "diverged", "ok", "no_summary"]


def test_the_sweep_has_ok_diverged_crashed_and_aborted_runs(runs):
    assert [check_file(str(runs / f"run-{n}.txt")) for n in range(1, 9)] == list(zip(REFERENCE, REASONS))
    assert "ZeroDivisionError" in (runs / "run-5.txt").read_text()
    assert "summary" not in (runs / "run-8.txt").read_text()


def test_the_sweep_exit_statuses(tmp_path):
    codes = [subprocess.run([sys.executable, "-m", "demo.demo_sweep", "--out", str(tmp_path), "--task", str(n)],
                            cwd=REPO, capture_output=True, timeout=60).returncode for n in (1, 3, 5, 8, 9)]
    assert codes == [0, 0, 1, -6, 0]  # task 9 is parameter set 1 again


@pytest.mark.parametrize("text, expected", [
    (None, ("bad", "missing")),
    ("params: k=1\nt=1 x=1.0 v=0.0 energy=0.5\n", ("bad", "no_summary")),
    ("summary: status=ok final_energy=1.0e-01 energy_ratio=2.0e+00\n", ("bad", "energy_grew")),
    ("t=1 x=nan v=0 energy=0\nsummary: status=ok final_energy=1e-3 energy_ratio=1e-3\n", ("bad", "non_finite")),
    ("summary: status=ok final_energy=1e-3 energy_ratio=1e-3\n", ("ok", "ok")),
])
def test_the_reference_checker(text, expected):
    assert check_run(text) == expected


def test_agreement_counts_a_missing_verdict_as_a_disagreement():
    result = agreement([("ok", "ok"), ("bad", "bad"), (None, "bad"), ("ok", "bad")])
    assert (result["total"], result["agreed"], result["agreement"]) == (4, 2, 0.5)
    assert result["caveat"] == SCRIPTED_CAVEAT and "not a model's quality" in SCRIPTED_CAVEAT


# --------------------------------------------------------------------------- review agents in sandboxes

# --------------------------------------------------------------------------- the launch, on the fake scheduler
