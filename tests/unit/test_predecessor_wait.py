"""Trial 4 (issue 16), findings 2, 3, 4 and the triage items of 10.

A campaign whose tasks wait for their ``-hold_jid_ad`` predecessor is ``waiting``, not ``paused``;
the forecast counts the predecessor and the chosen queue; triage says who holds what in tco.
The qstat shapes are real captures (tests/fixtures/sge819/README.md, "Array dependencies").
"""
from __future__ import annotations

from pathlib import Path


from schedulers.gridengine.parsers.qstat import parse_qstat
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from schedulers.pending import explain_pending

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sge819"
PRED, SUCC, SUCC_HELD = 1046, 1047, 1048  # the captured jobs


def _detail(name: str) -> dict:
    return parse_job_detail((FIXTURES / name).read_bytes())


def test_qstat_shows_hqw_for_a_dependency_wait_and_for_a_hold_alike():
    """Why tco's own record decides: SGE 8.1.9 shows the same state and the same qstat -j for both."""
    tasks = {(t.job_number, t.task_number): t.state for t in parse_qstat(
        (FIXTURES / "qstat_xml_hold_jid_ad.xml").read_bytes())}
    assert tasks[(SUCC, 2)] == "held"  # waits for task 2 of 1046 only
    assert tasks[(SUCC_HELD, 1)] == tasks[(SUCC_HELD, 2)] == "held"  # user hold (+ dependency on task 2)
    waiting, held = _detail("qstat_j_hold_jid_ad.xml"), _detail("qstat_j_hold_jid_ad_held.xml")
    assert waiting["predecessors"] == held["predecessors"] == [PRED]
    assert waiting["holds"] == held["holds"] == {}


def test_a_dependency_wait_is_not_called_a_user_operator_or_system_hold():
    reasons = [r["text"] for r in explain_pending(_detail("qstat_j_hold_jid_ad.xml"))]
    assert f"waiting for job {PRED} to finish" in reasons
    assert not any(r.startswith("held by") for r in reasons), reasons
    # A job with no predecessor that is in hold state still says so.
    plain = {**_detail("qstat_j_hold_jid_ad.xml"), "predecessors": []}
    assert "held by user/operator/system" in [r["text"] for r in explain_pending(plain)]
