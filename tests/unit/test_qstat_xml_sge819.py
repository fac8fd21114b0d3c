"""Replay of real SGE 8.1.9 output captured on the dev cluster (tests/fixtures/sge819/).

Job ids and what each job was made to do are in sge819/job_ids.txt and README.md.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from worker.schedulers import qstat_xml
from worker.schedulers.base import UnknownJob
from worker.schedulers.pending import explain_pending
from worker.schedulers.qstat_xml import (parse_cluster_queue_summary, parse_job_detail, parse_qhost, parse_qquota,
                                         parse_qstat)

SGE819 = Path(__file__).resolve().parent.parent / "fixtures" / "sge819"
UTC = dt.timezone.utc
STARTED = dt.datetime(2026, 11, 29, 16, 25, 15, tzinfo=UTC)

# (job, task) -> (state_code, state, queue, host), from qstat_all_users.txt (plain qstat -u '*').
EXPECTED = {
    (122, 0): ("r", "running", "classic.q", "vm"),
    (123, 0): ("r", "running", "classic.q", "vm"),
    (124, 1): ("r", "running", "agent.q", "vm"),
    (124, 2): ("r", "running", "agent.q", "vm"),
    (124, 3): ("r", "running", "agent.q", "vm"),
    (125, 1): ("r", "running", "agent.q", "vm"),
    (125, 2): ("r", "running", "agent.q", "vm"),
    (125, 3): ("qw", "pending", None, None),
    (125, 4): ("qw", "pending", None, None),
    (126, 1): ("hqw", "held", None, None),
    (126, 4): ("hqw", "held", None, None),
    (126, 7): ("hqw", "held", None, None),
    (126, 10): ("hqw", "held", None, None),
    (127, 0): ("hqw", "held", None, None),
    (128, 0): ("hqw", "held", None, None),
    (129, 0): ("qw", "pending", None, None),
    (130, 0): ("qw", "pending", None, None),
    (131, 0): ("Eqw", "error", None, None),
}


def load(name: str) -> bytes:
    return (SGE819 / name).read_bytes()


def summary(tasks) -> dict:
    return {t.key: (t.state_code, t.state, t.queue, t.host) for t in tasks}


@pytest.mark.parametrize("name", ["qstat_xml_all_users.xml", "qstat_xml_all_users_full.xml",
                                  "qstat_xml_all_users_g_d.xml", "qstat_xml_ext_urg_pri.xml"])
def test_every_qstat_variant_lists_the_same_tasks_as_plain_qstat(name):
    assert summary(parse_qstat(load(name))) == EXPECTED


def test_default_qstat_times_priorities_and_array_forms():
    tasks = {t.key: t for t in parse_qstat(load("qstat_xml_all_users.xml"))}
    assert tasks[(124, 2)].started_at == STARTED and tasks[(124, 2)].submitted_at is None
    assert tasks[(125, 3)].submitted_at == STARTED  # pending rows carry the submission time
    assert tasks[(130, 0)].priority == 1.0  # the -p 1024 job
    assert tasks[(127, 0)].task_number is None  # non-array: no <tasks> element
    assert [n for (job, n) in tasks if job == 126] == [1, 4, 7, 10]  # "1-10:3"
    assert [n for (job, n) in tasks if job == 125] == [1, 2, 3, 4]  # running 1, 2 and pending "3,4"
    assert all(t.project is None for t in tasks.values())  # no -ext, no project


def test_the_default_layout_takes_the_fast_path_and_agrees_with_lxml():
    data = load("qstat_xml_all_users.xml")
    fast = qstat_xml._fast_job_rows(data)
    assert fast is not None
    assert qstat_xml._tasks_from_rows(fast, UTC) == qstat_xml._tasks_from_rows(qstat_xml._lxml_job_rows(data), UTC)


def test_ext_output_gives_projects():
    tasks = {t.key: t for t in parse_qstat(load("qstat_xml_ext_urg_pri.xml"))}
    assert tasks[(124, 1)].project == "research"
    assert tasks[(125, 4)].project == "engineering"
    assert tasks[(122, 0)].project is None


def test_no_jobs_gives_no_tasks():
    assert parse_qstat(load("qstat_xml_empty.xml")) == []


def test_cluster_queue_summary():
    agent, classic = parse_cluster_queue_summary(load("qstat_g_c.xml"))
    assert (agent["name"], agent["used"], agent["available"], agent["total"]) == ("agent.q", 5, 91, 96)
    assert (classic["name"], classic["used"], classic["available"], classic["total"]) == ("classic.q", 2, 0, 2)
    assert agent["load"] == 0.67529


def test_qhost_global_seats_and_host_memory():
    hosts = {h["name"]: h for h in parse_qhost(load("qhost_F.xml"))}
    assert hosts["global"]["resources"] == {"anthropic_api": {"value": "13.000000", "dominance": "gc"}}
    assert hosts["global"]["mem_total_bytes"] is None
    vm = hosts["vm"]
    assert (vm["arch"], vm["num_proc"], vm["load_avg"]) == ("lx-amd64", 2, 1.35)
    assert vm["mem_total_bytes"] == round(23.5 * 1024**3)
    assert vm["mem_used_bytes"] == round(474.7 * 1024**2)
    assert vm["swap_total_bytes"] == 0
    assert vm["resources"]["m_topology"] == {"value": "SCC", "dominance": "hl"}
    assert {h["name"] for h in parse_qhost(load("qhost_q.xml"))} == {"global", "vm"}


def test_qquota_with_its_default_namespace():
    assert parse_qquota(load("qquota.xml")) == [
        {"rule": "agent_cap/1", "resource": "slots", "limit": 96, "used": 5, "filters": {"queues": ["agent.q"]}}]


def test_job_detail_of_a_running_array():
    detail = parse_job_detail(load("qstat_j_running_array.xml"))
    assert (detail["job_number"], detail["name"], detail["owner"], detail["project"]) == (
        124, "fx_array_run", "tco", "research")
    assert detail["hard_resources"] == {"anthropic_api": "1"}
    assert detail["tasks"] == [{"task_number": n, "state": "running"} for n in (1, 2, 3)]
    assert detail["submitted_at"] == STARTED
    assert detail["hard_queues"] == ["agent.q"]
    assert explain_pending(detail) == []


def test_job_detail_of_an_array_short_of_api_seats():
    detail = parse_job_detail(load("qstat_j_pending_api_short.xml"))
    assert detail["hard_resources"] == {"anthropic_api": "40"}
    assert detail["project"] == "engineering"
    assert detail["scheduler_messages"] == [
        "(-l anthropic_api=40) cannot run globally because it offers only gc:anthropic_api=13.000000"]
    hosts = parse_qhost(load("qhost_F.xml"))
    assert [r["text"] for r in explain_pending(detail, hosts=hosts, capacities={"anthropic_api": 96})] == [
        "waiting for a model API seat: 83 of 96 in use (consumable anthropic_api, global)"]


def test_job_detail_of_a_job_in_error_gives_the_execd_reason():
    detail = parse_job_detail(load("qstat_j_error.xml"))
    assert detail["tasks"] == [{"task_number": 1, "state": "pending"}]  # 8.1.9 prints JAT_status 0 for Eqw
    assert detail["errors"][0]["message"].endswith("error: can't chdir to /nonexistent: No such file or directory")
    (reason,) = explain_pending(detail)
    assert reason["text"] == ("in error state: can't chdir to /nonexistent: No such file or directory; "
                              "fix the cause, then clear it with qmod -cj 131 (or delete it)")
    assert reason["raw"] == "Job is in error state"


@pytest.mark.parametrize("name", ["qstat_j_held.xml", "qstat_j_held_array_step.xml"])
def test_job_detail_of_held_jobs(name):
    detail = parse_job_detail(load(name))
    assert detail["tasks"] == [] and detail["scheduler_messages"] == ["Job is in hold state"]
    assert [r["text"] for r in explain_pending(detail)] == ["held by user/operator/system",
                                                           "queue instance classic.q@vm is full"]


def test_job_detail_of_a_job_waiting_on_another():
    detail = parse_job_detail(load("qstat_j_hold_jid.xml"))
    assert detail["predecessors"] == [122]
    assert explain_pending(detail)[0]["text"] == "waiting for job 122 to finish"


@pytest.mark.parametrize("name", ["qstat_j_pending_classic.xml", "qstat_j_pending_urgent.xml"])
def test_a_job_behind_a_full_queue_names_the_queue_first(name):
    detail = parse_job_detail(load(name))
    assert detail["hard_queues"] == ["classic.q"]
    assert detail["global_messages"] == ['queue instance "classic.q@vm" dropped because it is full']
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
