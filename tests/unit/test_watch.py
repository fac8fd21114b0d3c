"""The live-lag and scoping arithmetic of the seed replay's watchers (demo/watch/; issue 15 items 4, 5).

Every expected value below is worked out by hand from the synthetic timestamps.
"""
from __future__ import annotations

import pytest

from demo.watch.browsers import Client
from demo.watch.lags import (GONE, LAG_PARTS, STARTED, Sightings, count_lags, lag_breakdown, lag_summary, percentile,
                             scope_check, shown_changes, task_lags)
from demo.watch.report import pooled_breakdown


def test_percentile_is_the_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.95) == 5.0          # ceil(4.75) = 5th of 5
    assert percentile(values, 0.2) == 1.0
    assert percentile(list(range(1, 101)), 0.95) == 95
    assert percentile([], 0.5) is None
    assert lag_summary([0.5, 1.5]) == {"n": 2, "p50": 0.5, "p95": 1.5, "max": 1.5, "min": 0.5}


def test_qstat_sightings_keep_the_first_sample_of_each_change():
    s = Sightings()
    s.observe(100.0, {(7, 1): "pending", (7, 2): "pending", (7, 3): "pending"}, complete_jobs=s.jobs())
    s.observe(100.5, {(7, 1): "running", (7, 2): "pending", (7, 3): "pending"}, complete_jobs=s.jobs())
    s.observe(101.0, {(7, 1): "running", (7, 2): "starting", (7, 3): "pending"}, complete_jobs=s.jobs())
    # task 1 gone; task 3 started and ended between two samples: both changes at its gone sample
    s.observe(101.5, {(7, 2): "running"}, complete_jobs=s.jobs())
    s.observe(102.0, {}, complete_jobs=s.jobs())
    assert s.first == {
        (7, 1, STARTED): 100.5, (7, 1, GONE): 101.5,
        (7, 2, STARTED): 101.0, (7, 2, GONE): 102.0,
        (7, 3, STARTED): 101.5, (7, 3, GONE): 101.5,
    }


def test_page_rows_count_finishing_and_terminal_states_as_ended_and_held_as_not_started():
    s = Sightings()
    s.observe(10.0, {(8, 1): "held", (8, 2): "error", (8, 3): "finishing"})
    s.observe(11.0, {(8, 1): "running", (8, 2): "done"})
    # a page observation is not complete: task 3 missing from a later page is not "gone" again
    assert s.first == {(8, 3, STARTED): 10.0, (8, 3, GONE): 10.0, (8, 1, STARTED): 11.0,
                       (8, 2, STARTED): 11.0, (8, 2, GONE): 11.0}


def test_task_lags_match_changes_by_task_and_report_missed_and_unexpected():
    sighted = {(7, 1, STARTED): 100.0, (7, 1, GONE): 120.0, (7, 2, STARTED): 100.25, (9, 1, STARTED): 100.0}
    arrived = {(7, 1, STARTED): 101.5, (7, 2, STARTED): 100.0, (7, 3, STARTED): 103.0, (9, 1, STARTED): 200.0}
    out = task_lags(sighted, arrived, jobs={7})
    assert out["lags"] == [1.5, -0.25]          # (7,1,started) then (7,2,started); job 9 is not this client's
    assert (out["received"], out["expected"]) == (2, 3)
    assert out["missed"] == [(7, 1, GONE)]
    assert out["unexpected"] == [(7, 3, STARTED)]
    # changes sighted before the client was connected arrive (received) but give no lag
    late = task_lags(sighted, arrived, jobs={7}, since=100.1)
    assert late["lags"] == [-0.25] and late["received"] == 2
    # per change (its page's socket): task 1's socket from 99, task 2's never connected
    per_page = task_lags(sighted, arrived, jobs={7}, since=lambda k: 99.0 if k[1] == 1 else None)
    assert per_page["lags"] == [1.5] and per_page["received"] == 2


def test_count_lags_match_the_kth_sighting_with_the_first_count_reaching_k():
    sightings = [10.0, 10.0, 10.5, 14.0]
    series = [(9.0, 0), (11.0, 2), (12.0, 3), (13.0, 3)]
    out = count_lags(sightings, series)
    assert out["lags"] == [1.0, 1.0, 1.5]       # 11-10, 11-10, 12-10.5; the 4th never shown
    assert (out["received"], out["expected"]) == (3, 4)
    # a count jumping past several sightings answers them all at once
    assert count_lags([1.0, 2.0, 3.0], [(5.0, 3)])["lags"] == [4.0, 3.0, 2.0]
    assert count_lags([1.0, 2.0, 3.0], [(5.0, 3)], since=1.5)["lags"] == [3.0, 2.0]


def test_scope_check_flags_what_another_team_owns_and_an_unrefused_probe():
    clean = scope_check(allowed_campaigns={1, 3}, allowed_jobs={71}, allowed_projects={"research"},
                        seen_campaigns={1}, seen_projects={"research"}, arrived={(71, 1, STARTED): 1.0},
                        probes={2: 4403})
    assert clean == []
    bad = scope_check(allowed_campaigns={1}, allowed_jobs={71}, allowed_projects={"research"},
                      seen_campaigns={1, 2}, seen_projects={"research", "engineering"},
                      arrived={(71, 1, STARTED): 1.0, (72, 5, STARTED): 2.0, (72, 5, GONE): 3.0},
                      probes={2: None})
    assert bad == ["campaign 2 of another team", "project 'engineering'",
                   "1 task(s) of other jobs, e.g. [(72, 5)]", "campaign 2's socket was not refused (close code None)"]


def research_client_after(snapshots: list[tuple[float, str, dict]]) -> Client:
    client = Client(username="r", session_key="k")
    for at, kind, data in snapshots:
        (client.on_queue if kind == "queue" else client.on_campaign)(at, data)
    return client


def test_a_client_records_what_its_snapshots_show_and_the_check_catches_another_teams_rows():
    queue = {"campaigns": [{"id": 1, "project": "research", "states": {"pending": 1, "running": 2, "done": 1}}],
             "by_team": [{"team": "Research", "project": "research"}],
             "recent_finished": [{"campaign_id": 1, "project": "research"}]}
    leaked = {"campaigns": [{"id": 2, "project": "engineering", "states": {"running": 1}}]}
    page = {"campaign": {"id": 1, "project": "research", "job_number": 71}, "page": 1,
            "tasks": [{"task_number": 1, "state": "running"}, {"task_number": 2, "state": "pending"}]}
    client = research_client_after([(5.0, "queue", queue), (6.0, "campaign", page), (7.0, "queue", leaked)])
    assert client.queue_counts[1] == [(5.0, 3, 1)]       # started: running 2 + done 1; ended: done 1
    assert client.arrivals.first == {(71, 1, STARTED): 6.0}
    assert client.seen_campaigns == {1, 2} and client.seen_projects == {"research", "engineering"}
    problems = scope_check(allowed_campaigns={1}, allowed_jobs={71}, allowed_projects={"research"},
                           seen_campaigns=client.seen_campaigns, seen_projects=client.seen_projects,
                           arrived=client.arrivals.first, probes={})
    assert problems == ["campaign 2 of another team", "project 'engineering'"]


@pytest.mark.parametrize("states,started,ended", [({"pending": 3}, 0, 0), ({"finishing": 1, "failed": 1}, 2, 2),
                                                  ({"held": 1, "starting": 1}, 1, 0)])
def test_queue_counts_per_campaign(states, started, ended):
    client = research_client_after([(1.0, "queue", {"campaigns": [{"id": 4, "project": "p", "states": states}]})])
    assert client.queue_counts[4] == [(1.0, started, ended)]


def test_the_lag_is_split_at_the_instants_the_snapshot_names_and_the_parts_add_up():
    # Task 1 started: the sampler saw it at 100.0, the poll's qstat began at 100.4, its change was
    # committed at 101.1, the producer's read began at 101.15 and it published at 101.3; the client had
    # it at 101.35 (lag 1.35 s). Task 2 ended: sighted 200.0, the poll's qstat began at 199.9 (before the
    # sampler's), committed 200.6, read 201.6, published 203.0, arrived 203.7 (lag 3.7 s). Task 3: its
    # first snapshot answered no poll (a connect snapshot).
    one, two, three = (7, 1, STARTED), (7, 2, GONE), (7, 3, STARTED)
    sighted = {one: 100.0, two: 200.0, three: 300.0}
    arrived = {one: 101.35, two: 203.7, three: 300.5}
    news = {one: {"observed_at": 100.4, "committed_at": 101.1, "read_at": 101.15, "published_at": 101.3},
            two: {"observed_at": 199.9, "committed_at": 200.6, "read_at": 201.6, "published_at": 203.0},
            three: {"observed_at": None, "committed_at": None, "read_at": 300.3, "published_at": 300.4}}
    out = lag_breakdown(sighted, arrived, news, [one, two, three])
    assert (out["n"], out["unsplit"]) == (2, 1)
    cadence, poll, wait, build, fanout = (out["parts"][label] for label, _, _ in LAG_PARTS)
    assert cadence == pytest.approx([0.4, -0.1])
    assert poll == pytest.approx([0.7, 0.7])
    assert wait == pytest.approx([0.05, 1.0])
    assert build == pytest.approx([0.15, 1.4])
    assert fanout == pytest.approx([0.05, 0.7])
    for i, lag in enumerate([1.35, 3.7]):
        assert cadence[i] + poll[i] + wait[i] + build[i] + fanout[i] == pytest.approx(lag)
    # only the keys asked for; a change without news at all is unsplit
    assert lag_breakdown(sighted, arrived, {}, [one])["unsplit"] == 1
    pooled = pooled_breakdown([out, lag_breakdown(sighted, arrived, news, [one])])
    assert (pooled["n"], pooled["unsplit"], pooled["parts"][LAG_PARTS[3][0]]) == (3, 1,
                                                                                pytest.approx([0.15, 1.4, 0.15]))


def test_a_client_keeps_the_as_of_of_the_first_snapshot_showing_each_change():
    client = Client(username="x", session_key="k")
    page = {"campaign": {"id": 1, "project": "research", "job_number": 71}, "page": 1,
            "tasks": [{"task_number": 1, "state": "running"}, {"task_number": 2, "state": "pending"}]}
    client.on_campaign(6.0, page, {"observed_at": 5.0, "committed_at": 5.5, "published_at": 5.9})
    page["tasks"][1]["state"] = "running"
    client.on_campaign(8.0, page, {"observed_at": 7.0, "committed_at": 7.5, "published_at": 7.9})
    assert client.news == {(71, 1, STARTED): {"observed_at": 5.0, "committed_at": 5.5, "published_at": 5.9},
                           (71, 2, STARTED): {"observed_at": 7.0, "committed_at": 7.5, "published_at": 7.9}}
    assert task_lags({(71, 1, STARTED): 4.0}, client.arrivals.first, jobs={71})["keys"] == [(71, 1, STARTED)]


def test_a_client_expects_the_changes_of_the_task_rows_it_has_open():
    # job 71 is campaign 1 (tasks 1-100 on page 1, 101-200 on page 2), job 72 campaign 2, job 73 not allowed
    sighted = {(71, 1, STARTED): 1.0, (71, 100, GONE): 2.0, (71, 101, STARTED): 3.0, (72, 5, STARTED): 4.0,
               (73, 1, STARTED): 5.0}
    assert shown_changes(sighted, {71: 1, 72: 2}, {(1, 1)}) == {(71, 1, STARTED): 1.0, (71, 100, GONE): 2.0}
    assert shown_changes(sighted, {71: 1, 72: 2}, {(1, 2), (2, 1)}) == {(71, 101, STARTED): 3.0,
                                                                         (72, 5, STARTED): 4.0}
    assert shown_changes(sighted, {71: 1}, set()) == {}


BURNER = r"""
import os, subprocess, sys, time
if sys.argv[1] == "child":
    while time.process_time() < 0.4:
        pass
    sys.exit(0)
child = subprocess.run([sys.executable, "-c", sys.argv[2], "child"])  # reaped: counted in cutime
while time.process_time() < 0.3:
    pass
t = os.times()
print(t.user + t.system, t.children_user + t.children_system, flush=True)
time.sleep(30)
"""


def test_cpu_seconds_count_a_process_and_the_children_it_reaped():
    import subprocess
    import sys

    from demo.watch.samplers import cpu_seconds

    proc = subprocess.Popen([sys.executable, "-c", BURNER, "parent", BURNER], stdout=subprocess.PIPE, text=True)
    try:
        own, reaped = (float(v) for v in proc.stdout.readline().split())
        measured = cpu_seconds(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert reaped >= 0.39 and own >= 0.29
    assert measured == pytest.approx(own + reaped, abs=0.05)
    assert cpu_seconds(proc.pid) == 0.0          # gone


def test_cpu_by_command_sums_deltas_per_name_and_counts_new_processes_whole():
    from demo.watch.samplers import cpu_by_command

    before = {(10, 1): ("sge_qmaster", 0, 5.0), (11, 2): ("python manage.py tco_poll", 0, 1.0),
              (12, 3): ("agent", 19, 2.0), (13, 4): ("gone", 0, 9.0)}
    after = {(10, 1): ("sge_qmaster", 0, 6.5), (11, 2): ("python manage.py tco_poll", 0, 4.0),
             (12, 3): ("agent", 19, 2.5), (14, 5): ("agent", 19, 0.75),
             (11, 9): ("python manage.py tco_poll", 0, 0.5)}   # pid 11 reused: a new process
    assert cpu_by_command(before, after) == [("python manage.py tco_poll", 3.5), ("sge_qmaster", 1.5),
                                             ("agent (nice 19)", 1.25)]
