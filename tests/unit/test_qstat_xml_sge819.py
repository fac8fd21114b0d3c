"""Replay of real SGE 8.1.9 output captured on the dev cluster (tests/fixtures/sge819/).

The captures can be refreshed (scripts/capture-fixtures), which changes job ids
and times; so job ids come from sge819/job_ids.txt, and the expected task list
comes from the plain ``qstat -u '*'`` captured at the same moment
(qstat_all_users.txt), an independent rendering of the same state.
"""
from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from schedulers.base import UnknownJob
from schedulers.gridengine.parsers import qstat as qstat_xml
from schedulers.gridengine.parsers.qhost import parse_qhost
from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.gridengine.parsers.qstat import expand_task_ranges, parse_qstat
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from schedulers.gridengine.parsers.queue_summary import parse_cluster_queue_summary
from schedulers.pending import explain_pending

SGE819 = Path(__file__).resolve().parent.parent / "fixtures" / "sge819"
UTC = dt.timezone.utc


def load(name: str) -> bytes:
    return (SGE819 / name).read_bytes()


def job_ids() -> dict[str, int]:
    """fx_* job name -> job number, from job_ids.txt."""
    return {name: int(number) for name, number in re.findall(r"(fx_\w+)=(\d+)", (SGE819 / "job_ids.txt").read_text())}


def plain_qstat() -> dict[tuple[int, int], dict]:
    """The plain ``qstat -u '*'`` table (TZ=UTC), one entry per task, as the oracle."""
    tasks = {}
    for line in (SGE819 / "qstat_all_users.txt").read_text().splitlines()[2:]:
        job, _prio, name, _user, state, date, time, *rest = line.split()
        queue = rest.pop(0) if "@" in rest[0] else None
        numbers = expand_task_ranges(rest[1]) if len(rest) > 1 else [0]
        when = dt.datetime.strptime(f"{date} {time}", "%m/%d/%Y %H:%M:%S").replace(tzinfo=UTC)
        for number in numbers:
            tasks[(int(job), number)] = {"name": name, "state": state, "queue": queue, "slots": int(rest[0]),
                                         "time": when}
    return tasks


def plain_qstat_j_submission(name: str) -> dt.datetime:
    match = re.search(r"^submission_time:\s+(.+)$", (SGE819 / name).read_text(), re.M)
    return dt.datetime.strptime(match.group(1).strip(), "%a %b %d %H:%M:%S %Y").replace(tzinfo=UTC)


@pytest.mark.parametrize("name", ["qstat_xml_all_users.xml", "qstat_xml_all_users_full.xml",
                                  "qstat_xml_all_users_g_d.xml", "qstat_xml_ext_urg_pri.xml"])
def test_every_qstat_xml_variant_lists_the_tasks_plain_qstat_shows(name):
    oracle = plain_qstat()
    tasks = {t.key: t for t in parse_qstat(load(name))}
    assert set(tasks) == set(oracle)
    for key, want in oracle.items():
        task = tasks[key]
        assert task.state_code == want["state"], key
        assert task.name.startswith(want["name"]), key  # plain qstat cuts names at 10 characters
        assert task.slots == want["slots"]
        assert (f"{task.queue}@{task.host}" if task.queue else None) == want["queue"], key
        assert (task.started_at if task.queue else task.submitted_at) == want["time"], key


def test_the_captured_cluster_state_maps_to_lifecycle_states():
    ids = job_ids()
    tasks = {t.key: t for t in parse_qstat(load("qstat_xml_all_users.xml"))}
    assert tasks[(ids["fx_error"], 0)].state == "error"
    assert {tasks[(ids["fx_array_held"], n)].state for n in (1, 4, 7, 10)} == {"held"}  # -t 1-10:3, held
    assert tasks[(ids["fx_held"], 0)].state == "held"
    assert tasks[(ids["fx_wait_dep"], 0)].state == "held"  # -hold_jid shows as hqw
    assert tasks[(ids["fx_pending"], 0)].state == "pending"
    assert tasks[(ids["fx_urgent"], 0)].priority == 1.0  # -p 1024
    assert tasks[(ids["fx_single"], 0)].task_number is None  # no <tasks>: not an array
    assert [t.state for t in tasks.values() if t.job_number == ids["fx_api_short"]] == [
        "running", "running", "pending", "pending"]  # running 1, 2; pending "3,4"
    assert all(t.project is None for t in tasks.values())  # projects only with -ext


def test_the_default_layout_takes_the_fast_path_and_agrees_with_lxml():
    data = load("qstat_xml_all_users.xml")
    fast = qstat_xml._fast_job_rows(data)
    assert fast is not None
    assert qstat_xml._tasks_from_rows(fast, UTC) == qstat_xml._tasks_from_rows(qstat_xml._lxml_job_rows(data), UTC)


def test_ext_output_gives_projects():
    ids = job_ids()
    tasks = {t.key: t for t in parse_qstat(load("qstat_xml_ext_urg_pri.xml"))}
    assert tasks[(ids["fx_array_run"], 1)].project == "research"
    assert tasks[(ids["fx_api_short"], 4)].project == "engineering"
    assert tasks[(ids["fx_single"], 0)].project is None


def test_no_jobs_gives_no_tasks():
    assert parse_qstat(load("qstat_xml_empty.xml")) == []


def test_cluster_queue_summary():
    queues = {q["name"]: q for q in parse_cluster_queue_summary(load("qstat_g_c.xml"))}
    assert set(queues) == {"agent.q", "classic.q"}
    assert queues["agent.q"]["total"] == 96 and queues["classic.q"]["total"] == 2  # docs/dev-cluster.md: 96 and 2 slots
    assert queues["classic.q"]["used"] == 2 and queues["classic.q"]["available"] == 0  # full
    for queue in queues.values():
        assert queue["used"] + queue["resv"] + queue["available"] <= queue["total"]
        assert isinstance(queue["load"], float)


def test_qhost_global_seats_and_host_memory():
    hosts = {h["name"]: h for h in parse_qhost(load("qhost_F.xml"))}
    assert set(hosts) == {"global", "vm"}
    seats = hosts["global"]["resources"]["anthropic_api"]
    assert seats["dominance"] == "gc" and 0 <= float(seats["value"]) <= 96
    assert hosts["global"]["mem_total_bytes"] is None and hosts["global"]["num_proc"] is None
    vm = hosts["vm"]
    assert vm["arch"] == "lx-amd64" and vm["num_proc"] >= 1 and vm["load_avg"] >= 0
    assert 0 < vm["mem_used_bytes"] < vm["mem_total_bytes"]
    assert vm["swap_total_bytes"] == 0
    assert vm["resources"]["arch"] == {"value": "lx-amd64", "dominance": "hl"}
    assert [h["name"] for h in parse_qhost(load("qhost_q.xml"))] == ["global", "vm"]
    assert list(parse_qhost(load("qhost_F_anthropic_api.xml"))[1]["resources"]) == ["anthropic_api"]


def test_qquota_with_its_default_namespace():
    (quota,) = parse_qquota(load("qquota.xml"))
    assert (quota["rule"], quota["resource"], quota["limit"], quota["filters"]) == (
        "agent_cap/1", "slots", 96, {"queues": ["agent.q"]})
    running_in_agent_q = [t for t in parse_qstat(load("qstat_xml_all_users.xml"))
                          if t.queue == "agent.q" and t.state == "running"]
    assert quota["used"] == sum(t.slots for t in running_in_agent_q)


def test_job_detail_of_a_running_array():
    ids = job_ids()
    detail = parse_job_detail(load("qstat_j_running_array.xml"))
    assert (detail["job_number"], detail["name"], detail["owner"], detail["project"]) == (
        ids["fx_array_run"], "fx_array_run", "tco", "research")
    assert detail["hard_resources"] == {"anthropic_api": "1"}
    assert detail["tasks"] == [{"task_number": n, "state": "running"} for n in (1, 2, 3)]
    assert detail["hard_queues"] == ["agent.q"]
    assert detail["submitted_at"].tzinfo == UTC
    assert explain_pending(detail) == []


def test_job_detail_of_an_array_short_of_api_seats():
    detail = parse_job_detail(load("qstat_j_pending_api_short.xml"))
    assert detail["submitted_at"] == plain_qstat_j_submission("qstat_j_pending_api_short.txt")
    assert detail["hard_resources"] == {"anthropic_api": "40"}
    assert detail["project"] == "engineering"
    (message,) = detail["scheduler_messages"]
    free = float(re.search(r"gc:anthropic_api=([\d.]+)", message).group(1))
    assert message.startswith("(-l anthropic_api=40) cannot run globally because it offers only gc:anthropic_api=")
    hosts = parse_qhost(load("qhost_F.xml"))
    now_free = float({h["name"]: h for h in hosts}["global"]["resources"]["anthropic_api"]["value"])
    assert [r["text"] for r in explain_pending(detail)] == [
        f"waiting for a model API seat: the job asks 40 (-l anthropic_api=40); {free:g} free (consumable anthropic_api, "
        "global)"]
    assert [r["text"] for r in explain_pending(detail, hosts=hosts, capacities={"anthropic_api": 96})] == [
        f"waiting for a model API seat: the job asks 40 (-l anthropic_api=40); {96 - now_free:g} of 96 in use, "
        f"{now_free:g} free (consumable anthropic_api, global)"]


def test_job_detail_of_a_job_in_error_gives_the_execd_reason():
    detail = parse_job_detail(load("qstat_j_error.xml"))
    assert detail["job_number"] == job_ids()["fx_error"]
    assert detail["submitted_at"] == plain_qstat_j_submission("qstat_j_error.txt")
    assert detail["tasks"] == [{"task_number": 1, "state": "pending"}]  # 8.1.9 prints JAT_status 0 for Eqw
    assert detail["errors"][0]["message"].endswith("error: can't chdir to /nonexistent: No such file or directory")
    (reason,) = explain_pending(detail)
    assert reason["text"] == ("in error state: can't chdir to /nonexistent: No such file or directory; "
                              f"fix the cause, then clear it with qmod -cj {detail['job_number']} (or delete it)")
    assert reason["raw"] == "Job is in error state"


@pytest.mark.parametrize("name", ["qstat_j_held.xml", "qstat_j_held_array_step.xml"])
def test_job_detail_of_held_jobs(name):
    detail = parse_job_detail(load(name))
    assert detail["tasks"] == [] and detail["scheduler_messages"] == ["Job is in hold state"]
    assert [r["text"] for r in explain_pending(detail)][0] == "held by user/operator/system"


def test_job_detail_of_a_job_waiting_on_another():
    ids = job_ids()
    detail = parse_job_detail(load("qstat_j_hold_jid.xml"))
    assert detail["predecessors"] == [ids["fx_single"]]
    assert explain_pending(detail)[0]["text"] == f"waiting for job {ids['fx_single']} to finish"


@pytest.mark.parametrize("name", ["qstat_j_pending_classic.xml", "qstat_j_pending_urgent.xml"])
def test_a_job_behind_a_full_queue_names_the_queue_first(name):
    detail = parse_job_detail(load(name))
    assert detail["hard_queues"] == ["classic.q"]
    assert 'queue instance "classic.q@vm" dropped because it is full' in detail["global_messages"]
    assert [r["text"] for r in explain_pending(detail)] == [
        "queue instance classic.q@vm is full",
        "only runs in the queues it requested (-q); 1 other queue(s) skipped"]


def test_a_running_job_has_no_pending_reasons_even_with_global_messages():
    detail = parse_job_detail(load("qstat_j_running_single.xml"))
    assert detail["global_messages"] and detail["tasks"] == [{"task_number": 1, "state": "running"}]
    assert explain_pending(detail) == []


def test_an_unknown_job_id_raises_unknown_job():
    with pytest.raises(UnknownJob) as caught:
        parse_job_detail(load("qstat_j_unknown.xml"))
    assert caught.value.job_ids == ["9999999"]


def test_qstat_j_with_a_spaced_cull_tag_after_clear_error_still_parses():
    """SGE 8.1.9 writes ``<job ids>`` (not XML) in scheduler messages after ``qmod -cj``."""

    data = (SGE819 / "qstat_j_after_clear_error.xml").read_bytes()
    assert b"<job ids>" in data
    detail = parse_job_detail(data)
    assert detail["job_number"] == 302
    assert any("until clean up of a previous run has finished" in m for m in detail["scheduler_messages"])


def test_a_job_listing_given_as_a_queue_summary_is_refused_not_read_as_no_queues():
    import pytest

    from schedulers.base import SchedulerParseError

    with pytest.raises(SchedulerParseError, match="job listing"):
        parse_cluster_queue_summary((SGE819 / "qstat_xml_all_users.xml").read_bytes())
