"""Execution hosts: qstat -f parsing, host states, tasks on a lost host, and a poll's cost in N hosts.

Fixtures in tests/fixtures/multihost were recorded on the dev cluster's cell
with three execution hosts (scripts/dev-cluster --cell mh): mh-exec1's execd
killed (instance state ``u``), agent.q@mh-exec2 disabled (``d``) and a load
threshold of 0.1 on classic.q@mh-exec3 (``a``).
"""
from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from schedulers.base import QstatTask, SchedulerParseError
from schedulers.fake import FakeScheduler
from schedulers.hosts import (
    host_states,
    instance_problems,
    mark_unreachable,
    parse_queue_instances,
    tasks_with_host_states,
    unreachable_hosts,
)
from schedulers.gridengine.parsers.qhost import parse_qhost

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "multihost"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def instances_by_regex(data: bytes) -> dict[str, tuple[str, int, int]]:
    """name -> (state letters, slots used, slots total), read with regexes (not the parser under test)."""
    text = data.decode()
    found = {}
    for block in re.findall(r"<Queue-List>(.*?)</Queue-List>", text, re.S):
        block = re.sub(r"<job_list.*?</job_list>", "", block, flags=re.S)  # a job's own <state>
        name = re.search(r"<name>([^<]+)</name>", block).group(1)
        state = re.search(r"<state>([^<]*)</state>", block)
        used = int(re.search(r"<slots_used>(\d+)</slots_used>", block).group(1))
        total = int(re.search(r"<slots_total>(\d+)</slots_total>", block).group(1))
        found[name] = (state.group(1) if state else "", used, total)
    return found


@pytest.mark.parametrize("name", ["qstat_f_alarm.xml", "qstat_f_unknown_disabled.xml", "qstat_f_running.xml"])
def test_queue_instances_match_the_recorded_output(name):
    data = fixture(name)
    parsed = parse_queue_instances(data)
    expected = instances_by_regex(data)
    assert {qi["name"]: (qi["states"], qi["slots_used"], qi["slots_total"]) for qi in parsed} == expected
    for qi in parsed:
        assert qi["name"] == f"{qi['queue']}@{qi['host']}"


def test_an_alarm_carries_its_reason_and_an_unknown_host_has_no_load():
    parsed = {qi["name"]: qi for qi in parse_queue_instances(fixture("qstat_f_alarm.xml"))}
    assert parsed["classic.q@mh-exec3"]["states"] == "a"
    assert parsed["classic.q@mh-exec3"]["reasons"] == ["alarm hl:np_load_avg=1.766601 load-threshold=0.1"]
    assert parsed["agent.q@mh-exec1"]["states"] == "u" and parsed["agent.q@mh-exec1"]["load_avg"] is None
    assert parsed["agent.q@mh-exec2"]["states"] == "d" and parsed["agent.q@mh-exec2"]["load_avg"] == 3.53320


def test_host_states_from_qhost_and_queue_instances():
    hosts = host_states(parse_qhost(fixture("qhost_F_unknown.xml")),
                        parse_queue_instances(fixture("qstat_f_unknown_disabled.xml")),
                        {"mh-exec1": ["task 7.1", "task 7.2"]})
    by_name = {h["name"]: h for h in hosts}
    assert sorted(by_name) == ["mh-exec1", "mh-exec2", "mh-exec3"]  # no "global"
    assert by_name["mh-exec1"]["state"] == "unreachable"
    assert by_name["mh-exec1"]["load_avg"] is None and by_name["mh-exec1"]["mem_used_bytes"] is None
    assert (by_name["mh-exec1"]["slots_used"], by_name["mh-exec1"]["slots_total"]) == (2, 48)
    assert by_name["mh-exec1"]["tasks"] == ["task 7.1", "task 7.2"]
    assert any("agent.q@mh-exec1: u = unknown" in why for why in by_name["mh-exec1"]["why"])
    assert by_name["mh-exec2"]["state"] == "disabled"
    assert by_name["mh-exec3"]["state"] == "up" and by_name["mh-exec3"]["why"] == []
    assert by_name["mh-exec3"]["mem_total_bytes"] == round(23.5 * 1024**3)


def test_host_state_precedence():
    def instance(host, queue, states):
        return {"name": f"{queue}@{host}", "queue": queue, "host": host, "states": states, "reasons": [],
                "slots_used": 0, "slots_total": 1, "load_avg": 1.0}

    hosts = {h["name"]: h["state"] for h in host_states([], [
        instance("a", "agent.q", "au"), instance("a", "classic.q", "E"),
        instance("b", "agent.q", "E"), instance("b", "classic.q", "a"),
        instance("c", "agent.q", "d"), instance("c", "classic.q", "A"),
        instance("d", "agent.q", "d"), instance("d", "classic.q", "D"),
        instance("e", "agent.q", "d"), instance("e", "classic.q", ""),
        instance("f", "agent.q", "D"), instance("f", "classic.q", "C"),
        instance("g", "agent.q", "D"), instance("g", "classic.q", ""),
    ])}
    assert hosts == {"a": "unreachable", "b": "error", "c": "alarm", "d": "disabled", "e": "up", "f": "closed",
                     "g": "up"}


def test_a_calendar_closing_is_no_problem_but_a_disabled_or_alarmed_closed_instance_is():
    def instance(name, states):
        return {"name": name, "queue": name.split("@")[0], "host": name.split("@")[1], "states": states,
                "reasons": [], "slots_used": 0, "slots_total": 1, "load_avg": 1.0}

    problems = instance_problems([instance("agent.q@x", "D"), instance("agent.q@y", "C"), instance("agent.q@z", "dD"),
                                  instance("agent.q@w", "aD"), instance("agent.q@v", "")])
    assert [p["name"] for p in problems] == ["agent.q@z", "agent.q@w"]
    assert problems[0]["meanings"] == ["disabled", "disabled by its calendar"]


def test_instance_problems_list_only_instances_in_a_state_with_their_meaning():
    problems = instance_problems(parse_queue_instances(fixture("qstat_f_alarm.xml")))
    assert [(p["name"], p["states"]) for p in problems] == [
        ("agent.q@mh-exec1", "u"), ("agent.q@mh-exec2", "d"), ("classic.q@mh-exec3", "a")]
    assert problems[1]["meanings"] == ["disabled"]
    assert problems[2]["reasons"] == ["alarm hl:np_load_avg=1.766601 load-threshold=0.1"]
    assert instance_problems(parse_queue_instances(fixture("qstat_f_running.xml"))) == []


@pytest.mark.parametrize("data, message", [
    (b"", "empty"), (b"<job_info><queue_info>", "not XML"), (b"<qhost/>", "<qhost>"),
    (b"<job_info><queue_info><Queue-List><name>agent.q</name></Queue-List></queue_info></job_info>", "queue@host"),
    (b"<job_info><queue_info><Queue-List><name>a@h</name><slots_used>x</slots_used></Queue-List></queue_info>"
     b"</job_info>", "whole number"),
])
def test_bad_qstat_f_output_is_a_parse_error(data, message):
    with pytest.raises(SchedulerParseError, match=re.escape(message)):
        parse_queue_instances(data)


def test_an_entity_in_the_output_is_not_expanded():
    data = (b'<?xml version="1.0"?><!DOCTYPE job_info [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b"<job_info><queue_info><Queue-List><name>agent.q@h</name><state>&x;</state></Queue-List>"
            b"</queue_info></job_info>")
    [qi] = parse_queue_instances(data)
    assert "root:" not in qi["states"]


def task(number: int, state: str, code: str, host: str | None) -> QstatTask:
    now = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    return QstatTask(job_number=7, task_number=number, name="t", owner="tco", project="research", state=state,
                     state_code=code, restarted="R" in code, queue="agent.q" if host else None, host=host, slots=1,
                     submitted_at=now, started_at=now if host else None, priority=0.5)


def test_tasks_on_an_unreachable_host_become_unknown_and_no_others():
    tasks = [task(1, "running", "r", "h1"), task(2, "running", "Rr", "h1"), task(3, "running", "r", "h2"),
             task(4, "pending", "qw", None), task(5, "deleting", "dr", "h1")]
    assert mark_unreachable(tasks, unreachable_hosts([{"host": "h1", "states": "au"}, {"host": "h2", "states": "a"}]
                                                    )) == 3
    assert [(t.state, t.state_code, t.restarted) for t in tasks] == [
        ("unknown", "ru", False), ("unknown", "Rru", True), ("running", "r", False), ("pending", "qw", False),
        ("unknown", "dru", False)]
    # Marking again changes nothing (the poll may see the same snapshot twice).
    assert mark_unreachable(tasks, {"h1"}) == 0
    assert tasks[0].state_code == "ru"


def test_a_poll_through_the_fake_marks_the_lost_host_tasks_unknown():
    fake = FakeScheduler()
    job, tasks = fake.submit_array(_spec(3))
    fake.start(job, [1, 2], host="h1")
    fake.start(job, [3], host="h2")
    fake.host_states = {"h1": "u"}
    states = {t.task_number: (t.state, t.host) for t in tasks_with_host_states(fake)}
    assert states == {1: ("unknown", "h1"), 2: ("unknown", "h1"), 3: ("running", "h2")}


def test_a_polls_two_qstat_calls_run_at_the_same_time_and_a_failed_one_fails_the_poll():
    import threading
    import time as _time

    from schedulers.base import SchedulerUnavailable

    running, both = set(), threading.Event()

    class Slow(FakeScheduler):
        def _call(self, name, fail=False):
            running.add(name)
            if len(running) == 2:
                both.set()
            both.wait(2.0)                     # each waits for the other: only at the same time do they end
            _time.sleep(0.2)
            if fail:
                raise SchedulerUnavailable("qmaster gone")

        def list_tasks(self):
            self._call("qstat")
            return super().list_tasks()

        def queue_instances(self):
            self._call("qstat -f", fail=self.fail_f)
            return super().queue_instances()

    fake = Slow()
    fake.fail_f = False
    job, _ = fake.submit_array(_spec(2))
    fake.start(job, [1], host="h1")
    fake.host_states = {"h1": "u"}
    began = _time.monotonic()
    states = {t.task_number: t.state for t in tasks_with_host_states(fake)}
    assert both.is_set() and _time.monotonic() - began < 1.0
    assert states == {1: "unknown", 2: "pending"}
    running.clear()
    both.clear()
    fake.fail_f = True
    with pytest.raises(SchedulerUnavailable):
        tasks_with_host_states(fake)


def _spec(count: int):
    from schedulers.base import ArrayJobSpec

    return ArrayJobSpec(name="t", command="/bin/true", args=[], count=count, queue="agent.q", project="research",
                        resources={}, environment={}, working_directory="/tmp", output_path="/tmp",
                        error_path="/tmp")


# --- a poll's cost does not grow with the number of hosts ------------------------------


# --- -r y: a campaign option down to the native specification --------------------------


def test_rerunnable_adds_r_y_to_the_native_specification_and_nothing_else():
    from schedulers.gridengine.adapter import GridEngine

    engine = GridEngine(queues=["agent.q"], projects=["research"], resources=[])
    plain = engine.native_specification(_spec(2))
    rerun = engine.native_specification(dataclasses_replace(_spec(2), rerunnable=True))
    assert rerun.split() == plain.split() + ["-r", "y"]
    # Only a real bool: a truthy string from somewhere is refused, not read as yes.
    from schedulers.base import InvalidSubmission

    with pytest.raises(InvalidSubmission, match="rerunnable"):
        engine.native_specification(dataclasses_replace(_spec(2), rerunnable="yes"))


def dataclasses_replace(spec, **changes):
    import dataclasses

    return dataclasses.replace(spec, **changes)


# --- the pages: hosts on the queue page, per-host filter on the campaign page ----------


def test_host_filter_accepts_host_names_only():
    from dashboards.live.cluster import host_filter

    assert host_filter("sge-exec1") == "sge-exec1" and host_filter("node7.example.org") == "node7.example.org"
    for bad in ("", " h1", "h1:2", "a" * 300, None, 7, "-lead", "h1\n"):
        assert host_filter(bad) is None, bad


# --- a rerun task (-r y, host lost) is ended by its last attempt's record only ------------


def test_master_address_resolves_the_cells_act_qmaster(tmp_path):
    from schedulers.hosts import master_address

    common = tmp_path / "cellx" / "common"
    common.mkdir(parents=True)
    (common / "act_qmaster").write_text("localhost\n")
    assert master_address(str(tmp_path), "cellx") == "127.0.0.1"
    (common / "act_qmaster").write_text("\n")
    with pytest.raises(OSError, match="empty"):
        master_address(str(tmp_path), "cellx")
    with pytest.raises(OSError):
        master_address(str(tmp_path), "no-such-cell")


def test_a_host_qhost_reports_no_load_from_is_unreachable_before_its_instances_say_u():
    # qhost_F_unknown.xml: mh-exec1 reports no load (its execd is not heard from); qstat_f_running.xml:
    # every queue instance without a state letter yet (the qmaster marks them "u" only later).
    hosts = {h["name"]: h for h in host_states(parse_qhost(fixture("qhost_F_unknown.xml")),
                                               parse_queue_instances(fixture("qstat_f_running.xml")))}
    assert [q["states"] for q in hosts["mh-exec1"]["queues"]] == [""]
    assert (hosts["mh-exec1"]["state"], hosts["mh-exec1"]["why"]) == ("unreachable", ["qhost: no load reported"])
    assert {n: h["state"] for n, h in hosts.items() if n != "mh-exec1"} == {"mh-exec2": "up", "mh-exec3": "up"}
