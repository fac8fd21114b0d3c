"""Advance reservations and resource reservation (issue 17, items 1 and 3): the qrstat parser on
real captured XML, the qrsub/qrdel argv (no option injection), the pending reasons, and the
dashboard's booking service (roles, audit, another team's reservation refused)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from schedulers.base import InvalidSubmission, ReservationSpec, SchedulerCommandError
from schedulers.fake import FakeScheduler
from schedulers.gridengine.commands import reservation_id_from, reservation_submit_argv
from schedulers.gridengine.parsers.qrstat import duration_seconds, parse_qrstat
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from schedulers.pending import explain_pending, reservation_reasons

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OCS = FIXTURES / "ocs920"
SGE = FIXTURES / "sge819"
UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 1, 17, 19, tzinfo=UTC)


# --------------------------------------------------------------------------- parser

def test_ocs92_summary_and_detail_of_a_waiting_reservation():
    (summary,) = parse_qrstat((OCS / "qrstat_u_all.xml").read_bytes())
    # The file: <id>1</id> <name>ar_classic</name> <owner>ocsuser</owner> <state>w</state>,
    # 13:02:00 to 13:12:00, duration 00:10:00; the summary has no queue list.
    assert summary == {"id": 1, "name": "ar_classic", "owner": "ocsuser", "state_code": "w", "state": "waiting",
                       "start_at": dt.datetime(2026, 12, 1, 13, 2, tzinfo=UTC),
                       "end_at": dt.datetime(2026, 12, 1, 13, 12, tzinfo=UTC), "duration_s": 600}
    (detail,) = parse_qrstat((OCS / "qrstat_ar_1.xml").read_bytes())
    assert detail["queues"] == [{"queue_instance": "classic.q@vm", "queue": "classic.q", "host": "vm", "slots": 1}]
    assert detail["slots"] == 1 and detail["account"] == "sge" and detail["group"] == "ocsadmin"
    assert detail["submitted_at"] == dt.datetime(2026, 12, 1, 12, 59, 56, 390100, tzinfo=UTC)
    (running,) = parse_qrstat((OCS / "qrstat_ar_1_running.xml").read_bytes())
    assert running["state"] == "running" and running["state_code"] == "r"
    assert parse_qrstat((OCS / "qrstat_xml_empty.xml").read_bytes()) == []


def test_sge819_reservation_with_a_pe_as_the_dev_cluster_prints_it():
    (detail,) = parse_qrstat((SGE / "qrstat_ar_detail.xml").read_bytes())
    # granted_slots queue_instance="classic.q@sge-exec3" slots="2"; smp, 2; 17:11:00-17:21:00.
    assert detail["id"] == 2 and detail["name"] == "ar_classic" and detail["owner"] == "tco"
    assert detail["queues"] == [{"queue_instance": "classic.q@sge-exec3", "queue": "classic.q",
                                 "host": "sge-exec3", "slots": 2}]
    assert detail["slots"] == 2 and detail["pe"] == "smp" and detail["pe_slots"] == 2
    assert detail["start_at"] == dt.datetime(2026, 12, 1, 17, 11, tzinfo=UTC) and detail["duration_s"] == 600
    assert detail["submitted_at"] == dt.datetime(2026, 12, 1, 17, 8, 5, tzinfo=UTC)
    assert detail["state"] == "waiting" and detail["account"] == "sge" and detail["resources"] == {}
    (summary,) = parse_qrstat((SGE / "qrstat_u_all.xml").read_bytes())
    assert "queues" not in summary and summary["end_at"] == dt.datetime(2026, 12, 1, 17, 21, tzinfo=UTC)
    assert parse_qrstat((SGE / "qrstat_empty.xml").read_bytes()) == []


def test_sge819_seats_of_a_reservation_are_read_from_the_type_attribute():
    (detail,) = parse_qrstat((SGE / "qrstat_ar_seats.xml").read_bytes())
    # The plain twin (qrstat_ar_seats.txt) says "resource_list  anthropic_api=2".
    plain = (SGE / "qrstat_ar_seats.txt").read_text()
    name, _, value = plain.split("resource_list", 1)[1].split()[0].partition("=")
    assert detail["resources"] == {name: value} == {"anthropic_api": "2"}
    assert detail["slots"] == 1 and detail["pe"] is None and detail["name"] == "ar_seats"


def test_a_job_submitted_into_a_reservation_names_it_in_qstat_j():
    assert parse_job_detail((OCS / "qstat_j_in_ar.xml").read_bytes())["advance_reservation"] == 1
    plain = parse_job_detail((SGE / "qstat_j_pending_classic.xml").read_bytes())
    assert plain["advance_reservation"] is None and plain["reserve"] is False


def test_the_real_resource_reservation_the_scheduler_made_is_explained():
    """Captured: job 600 runs on one of classic.q's 2 slots, 601 asks -pe smp 2 -R y, and 602 (1 slot,
    h_rt 1 h) is told "offers only qc:slots=0.000000 due to a reservation"."""
    big = parse_job_detail((SGE / "qstat_j_rr_big.xml").read_bytes())
    small = parse_job_detail((SGE / "qstat_j_rr_small.xml").read_bytes())
    assert (big["reserve"], big["pe"], big["pe_slots"]) == (True, "smp", 2) and small["reserve"] is False
    texts = [r["text"] for r in explain_pending(small)]
    assert "slots on sge-exec3 are reserved for a job that asked for a resource reservation (-R y)" in texts
    assert not any("has only" in t for t in texts)  # not mistaken for a full queue
    reserving = [{"job_number": 601, "slots": 2, "pe": "smp", "queues": ["classic.q"]}]
    texts = [r["text"] for r in explain_pending(small, reserving_jobs=reserving)]
    assert "slots on sge-exec3 are reserved for job 601 (-R y), which needs 2 slots" in texts
    own = [r["text"] for r in explain_pending(big, reserving_jobs=reserving)]
    assert any(t.startswith("asked for a resource reservation (-R y)") for t in own)
    assert not any("reserved for job 601" in t for t in own)


@pytest.mark.parametrize("text, seconds", [("00:10:00", 600), ("25:00:01", 90001), ("61", 61), ("x", None)])
def test_durations(text, seconds):
    assert duration_seconds(text) == seconds


# --------------------------------------------------------------------------- argv

def spec(**fields) -> ReservationSpec:
    base = dict(name="deadline", start=dt.datetime(2026, 12, 1, 18, 0, tzinfo=UTC), duration_s=5400,
                queue="agent.q", seats=3)
    base.update(fields)
    return ReservationSpec(**base)


def test_qrsub_argv_is_built_from_checked_fields_in_utc():
    start = dt.datetime(2026, 12, 1, 19, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=1)))  # 18:00:30 UTC
    argv = reservation_submit_argv(spec(start=start), queues={"agent.q"}, resources={"anthropic_api"}, now=NOW)
    assert argv == ["qrsub", "-a", "202612011800.30", "-d", "01:30:00", "-N", "deadline", "-A", "tco",
                    "-q", "agent.q", "-l", "anthropic_api=3"]
    argv = reservation_submit_argv(spec(queue="classic.q", slots=2, pe="smp", seats=0, users=["tco"]), now=NOW)
    assert argv[-5:] == ["-pe", "smp", "2", "-u", "tco"] and "-l" not in argv


@pytest.mark.parametrize("fields, words", [
    ({"name": "-w"}, "reservation name"),
    ({"name": "a b"}, "reservation name"),
    ({"name": "x" * 65}, "reservation name"),
    ({"queue": "-q"}, "queue"),
    ({"queue": "other.q"}, "queue"),
    ({"slots": 2}, "parallel environment"),
    ({"slots": 2, "pe": "-pe"}, "parallel environment"),
    ({"users": ["-u"]}, "users"),
    ({"users": ["tco,root"]}, "users"),
    ({"account": "-A"}, "account"),
    ({"seat_resource": "h_rt"}, "consumable"),
    ({"duration_s": 59}, "duration"),
    ({"duration_s": True}, "duration"),
    ({"start": dt.datetime(2026, 12, 1, 17, 0, tzinfo=UTC)}, "past"),
    ({"start": dt.datetime(2026, 12, 1, 18, 0)}, "timezone-aware"),
])
def test_option_injection_and_bad_fields_are_refused_before_anything_runs(fields, words):
    with pytest.raises(InvalidSubmission, match=words):
        reservation_submit_argv(spec(**fields), queues={"agent.q", "classic.q"}, resources={"anthropic_api"},
                                now=NOW)


def test_the_adapter_runs_qrsub_qrstat_and_qrdel_as_argv_lists(monkeypatch):
    import schedulers.gridengine.adapter as gridengine

    calls = []
    answers = {"qrsub": b"Your advance reservation 12 has been granted\n",
               "qrstat": (OCS / "qrstat_u_all.xml").read_bytes(), "qrdel": b""}

    def run(argv, *, timeout=10.0, env_extra=None):
        calls.append(list(argv))
        if argv[:2] == ["qrstat", "-ar"]:
            return (OCS / "qrstat_ar_1.xml").read_bytes()
        return answers[argv[0]]

    monkeypatch.setattr(gridengine, "run_command", run)
    engine = gridengine.GridEngine(queues=["agent.q"], resources=["anthropic_api"])
    assert engine.reservation_submit(spec(start=dt.datetime.now(UTC) + dt.timedelta(hours=1))) == 12
    assert calls[-1][0] == "qrsub" and calls[-1][calls[-1].index("-N") + 1] == "deadline"
    (row,) = engine.reservations()
    assert calls[-2:] == [["qrstat", "-u", "*", "-xml"], ["qrstat", "-ar", "1", "-xml"]]
    assert row["id"] == 1 and row["queues"][0]["queue_instance"] == "classic.q@vm"
    engine.reservation_delete(12)
    assert calls[-1] == ["qrdel", "12"]
    before = len(calls)
    for bad in (0, -1, "12", True, "-f"):
        with pytest.raises(InvalidSubmission):
            engine.reservation_delete(bad)
    assert len(calls) == before


def test_qrsub_answer_without_an_id_is_an_error():
    assert reservation_id_from(b"Your advance reservation 7 has been granted") == 7
    with pytest.raises(SchedulerCommandError):
        reservation_id_from(b"error: no suitable queues")


def test_the_fake_books_lists_and_deletes_as_the_adapter_does():
    now = [NOW]
    fake = FakeScheduler(clock=lambda: now[0])
    ar = fake.reservation_submit(spec())
    (row,) = fake.reservations()
    assert row["id"] == ar and row["state"] == "waiting" and row["resources"] == {"anthropic_api": "3"}
    assert fake.reservation_calls[0] == reservation_submit_argv(spec(), now=NOW)
    now[0] = dt.datetime(2026, 12, 1, 18, 0, 1, tzinfo=UTC)
    assert fake.reservations()[0]["state"] == "running"
    with pytest.raises(InvalidSubmission):
        fake.reservation_submit(spec(name="-x"))
    fake.reservation_delete(ar)
    assert fake.reservations() == []
    with pytest.raises(SchedulerCommandError):
        fake.reservation_delete(ar)


# --------------------------------------------------------------------------- pending reasons

def test_a_job_in_a_future_reservation_waits_for_its_start_in_plain_words():
    detail = {"job_number": 5, "tasks": [{"task_number": 1, "state": "pending"}], "advance_reservation": 12}
    start = NOW + dt.timedelta(minutes=41)  # 18:00 UTC
    reservations = [{"id": 12, "team": "research", "start_at": start.isoformat(),
                     "end_at": (start + dt.timedelta(hours=1)).isoformat(), "state": "waiting", "state_code": "w"}]
    texts = [r["text"] for r in explain_pending(detail, reservations=reservations, now=NOW)]
    assert "waits for advance reservation 12 (team research), which starts at 18:00 UTC (in 41 min)" in texts
    tomorrow = [{**reservations[0], "start_at": (NOW + dt.timedelta(days=1, hours=2)).isoformat()}]
    assert reservation_reasons(detail, tomorrow, now=NOW)[0]["text"].endswith(
        "starts at 2026-12-02 19:19 UTC (in 26 h 00 min)")
    assert "qrstat no longer lists" in reservation_reasons(detail, [], now=NOW)[0]["text"]
    assert reservation_reasons(detail, None, now=NOW) == []  # no poll of reservations: nothing invented


def test_small_jobs_around_a_reserving_job_are_told_whose_reservation_holds_the_slots():
    small = {"job_number": 124, "tasks": [], "hard_queues": ["classic.q"]}
    reserving = [{"job_number": 123, "slots": 2, "pe": "smp", "queues": ["classic.q"]}]
    instances = [{"name": "classic.q@sge-exec3", "queue": "classic.q", "host": "sge-exec3", "slots_used": 1,
                  "slots_resv": 0, "slots_total": 2},
                 {"name": "agent.q@sge-exec1", "queue": "agent.q", "host": "sge-exec1", "slots_used": 0,
                  "slots_resv": 0, "slots_total": 48}]
    texts = [r["text"] for r in explain_pending(small, reserving_jobs=reserving, queue_instances=instances)]
    assert "slots on sge-exec3 are reserved for job 123 (-R y), which needs 2 slots" in texts
    agent_job = {"job_number": 125, "tasks": [], "hard_queues": ["agent.q"]}
    assert reservation_reasons(agent_job, reserving_jobs=reserving, queue_instances=instances) == []
    big = {"job_number": 123, "tasks": [], "reserve": True, "pe_slots": 2}
    (own,) = reservation_reasons(big, reserving_jobs=reserving, queue_instances=instances)
    assert own["text"].startswith("asked for a resource reservation (-R y)") and "2 slots" in own["text"]


# --------------------------------------------------------------------------- dashboards

def test_triage_groups_jobs_waiting_on_a_reservation():
    from dashboards.control.triage import GROUP_ACTIONS, _group_of

    def job(text):
        return {"errors": 0, "held": 0, "reasons": [{"text": text, "raw": ""}]}

    ar = _group_of(job("waits for advance reservation 12 (team research), which starts at 18:00 UTC (in 41 min)"),
                   None)
    assert ar == {"key": "reservation:ar12", "kind": "reservation",
                  "label": "wait for advance reservation 12 to start"}
    rr = _group_of(job("slots on sge-exec3 are reserved for job 123 (-R y), which needs 2 slots"), None)
    assert rr["key"] == "reservation:job123" and "job 123 (-R y)" in rr["label"]
    assert "reservation" in GROUP_ACTIONS


# --------------------------------------------------------------------------- a team's caps (issue 23, finding 2)
