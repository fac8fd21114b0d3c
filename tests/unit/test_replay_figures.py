"""The seed replay's pure figures (demo/replay/): work distribution, running counts, goals."""
from __future__ import annotations

import datetime as dt
import statistics
from types import SimpleNamespace

import pytest

from demo.replay.figures import running_over_time
from demo.replay.options import ARTICLE, work_durations
from demo.replay.report import goals

T0 = dt.datetime(2026, 11, 9, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_work_durations_have_the_article_median_scaled_and_stay_in_bounds():
    work = work_durations(1001, scale=1.0, seed=7)
    assert abs(statistics.median(work) - 21.9) < 21.9 * 0.05
    assert min(work) >= 10.9 and max(work) <= 43.8 and len(set(work)) > 50
    small = work_durations(1001, scale=0.05, seed=7)
    assert abs(statistics.median(small) - 1.1) <= 0.1
    assert work_durations(5, seed=3) == work_durations(5, seed=3)


def test_running_over_time_counts_tasks_between_their_runner_start_and_teardown():
    tasks = [SimpleNamespace(project="research", task_started_at=at(0), teardown_done_at=at(10)),
             SimpleNamespace(project="research", task_started_at=at(5), teardown_done_at=at(12)),
             SimpleNamespace(project="engineering", task_started_at=at(6), teardown_done_at=at(8)),
             SimpleNamespace(project="engineering", task_started_at=None, teardown_done_at=None)]
    result = running_over_time(tasks, step_s=5)
    assert result["t"] == [0, 5, 10, 15]
    assert result["projects"] == {"engineering": [0, 0, 0, 0], "research": [1, 2, 1, 0]}
    assert result["peak_total"] == 3  # at 6 s, between two samples


def test_goals_say_what_was_missed_and_by_how_much():
    run = {"stages": {"sandbox_start": 0.05, "integration_overhead": 0.5},
           "launch": {"all_in_scheduler_s": 0.2, "tasks": 410}, "urgent_wait_s": 3.5}
    lines = goals(run, None)
    assert f"met: sandbox start (two teams) 0.050 s <= {ARTICLE['sandbox_start'] / 10:.2f} s" in lines[0]
    assert lines[1].startswith("MISSED: integration overhead (two teams) 0.500 s > 0.20 s, by 0.300 s")
    assert lines[2].startswith("met: all 410 tasks")
    assert lines[3].startswith("MISSED: urgent agent waited 3.500 s > 2 s, by 1.500 s")


def test_submit_here_waits_for_the_submit_worker_when_it_claimed_the_campaign_first(monkeypatch):
    """Beside make demo's submit worker, campaign_submit here can find the campaign claimed: its
    job number then comes from the worker (read again), not None (run 2 crashed on that)."""
    from demo.replay import waiting

    rows = {1: SimpleNamespace(pk=1, job_number=None)}
    reads = []

    class Objects:
        @staticmethod
        def get(pk):
            reads.append(pk)
            if len(reads) >= 3:   # the worker's DRMAA call returns after a while
                rows[pk] = SimpleNamespace(pk=pk, job_number=4711)
            return rows[pk]

    monkeypatch.setattr(waiting, "campaign_submit", lambda campaign_id: SimpleNamespace(pk=campaign_id, job_number=None))
    monkeypatch.setattr(waiting, "Campaign", SimpleNamespace(objects=Objects))
    monkeypatch.setattr(waiting.time, "sleep", lambda s: None)
    assert [c.job_number for c in waiting.submitted([rows[1]], submit_here=True)] == [4711]
    # Submitted here: no waiting.
    monkeypatch.setattr(waiting, "campaign_submit", lambda campaign_id: SimpleNamespace(pk=campaign_id, job_number=99))
    reads.clear()
    assert [c.job_number for c in waiting.submitted([rows[1]], submit_here=True)] == [99] and reads == []


def test_the_urgent_wait_is_measured_from_the_drmaa_return_the_whole_second_time_bounds_it():
    """The dev cluster's run: DRMAA returned 20:47:12.954419, the runner started 20:47:14.132030, the
    scheduler's submission time says 20:47:12 (whole seconds): 1.177611 s, at most 2.132030 s."""
    from demo.replay.figures import urgent_wait

    day = dt.datetime(2026, 12, 1, 20, 47, tzinfo=dt.timezone.utc)
    campaign = SimpleNamespace(submitted_at=day.replace(second=12, microsecond=954419))
    task = SimpleNamespace(submitted_at=day.replace(second=12), task_started_at=day.replace(second=14, microsecond=132030),
                           started_at=day.replace(second=14), sandbox_create_at=None, sandbox_ready_at=None,
                           agent_started_at=None, agent_exited_at=None, teardown_done_at=None)
    got = urgent_wait(campaign, task)
    assert got["urgent_wait_s"] == pytest.approx(1.177611)
    assert got["urgent_wait_bound_s"] == pytest.approx(2.132030)
    # A runner that started before the DRMAA call returned (its record is the earlier clock): 0, never negative.
    early = SimpleNamespace(**{**vars(task), "task_started_at": day.replace(second=12, microsecond=900000)})
    assert urgent_wait(campaign, early)["urgent_wait_s"] == 0.0
    # Without tco's submission time: the scheduler's bound.
    assert urgent_wait(SimpleNamespace(submitted_at=None), task)["urgent_wait_s"] == pytest.approx(2.132030)
