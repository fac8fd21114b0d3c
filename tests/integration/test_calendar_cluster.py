"""Queue calendars on the real dev cluster: a short closed window on the test queue cal.q
(tests/support/calendar_window.py), a job that waits for it, tco's reason naming the calendar and
its opening time, the status poll's calendar state, and the job starting when the calendar opens.

Expected texts and times come from the window the test asks for (its end, computed here from the
clock), the queue instance state from ``qstat -f``, not from tco's calendar code.
"""
from __future__ import annotations

import datetime as dt

import pytest

from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.ingest.cluster_status import cluster_status_refresh
from schedulers.pending import explain_pending
from tests.integration.assistant_causes import qsub_sleep, scheduler_said
from tests.support.calendar_window import CALENDAR, closed_window, opening_reason, QUEUE
from tests.support.hosts import queue_instances
from tests.helpers import wait_until
from tests.support.cluster import qdel_quietly, qstat_jobs

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

#: The closed window: long enough for the checks made while it is closed (a few seconds, tens under load;
#: the test says so if they outlast it), short because the test then waits for it to open.
WINDOW_S = 45


def cal_queue_status() -> dict:
    """The status poll's entry for cal.q (a fresh poll)."""
    cluster = cluster_get_default()
    cluster_status_refresh(cluster=cluster)
    cluster.refresh_from_db()
    [row] = [q for q in cluster.status["queues"] if q["name"] == QUEUE]
    return row


def test_a_job_waits_for_the_calendar_and_starts_when_it_opens(bootstrap):
    jobs: list[int] = []
    try:
        with closed_window(WINDOW_S) as opens:
            # The queue instance is disabled by its calendar: state D (qstat -f).
            def cal_states() -> dict[str, str]:
                return {name: s for name, (s, _) in queue_instances().items() if name.startswith(QUEUE + "@")}
            wait_until(lambda: cal_states() and all("D" in s for s in cal_states().values()), 20,
                       "cal.q's queue instances disabled by the calendar (D)", 0.5)
            states = cal_states()
            row = cal_queue_status()
            assert (row["calendar"], row["calendar_state"]) == (CALENDAR, "off"), row
            assert row["calendar_next_change"] == opens.strftime("%Y-%m-%dT%H:%M:%SZ"), row
            assert row["calendar_next_state"] == "on", row
            assert row["calendar_text"] == f"{QUEUE}: calendar {CALENDAR}, closed until {opens:%H:%M:%S} UTC"

            job = qsub_sleep("-q", QUEUE, "-P", "research", name="calendar-wait", seconds=30)
            jobs.append(job)
            instance = next(iter(states))
            wait_until(lambda: scheduler_said(job, f'queue instance "{instance}" dropped because it is disabled'),
                       30, "the scheduler saying the queue instance is disabled", 0.5)
            cluster = cluster_get_default()
            detail = scheduler_for(cluster).job_detail(job)
            texts = [r["text"] for r in explain_pending(detail, queues=cluster.status["queues"])]
            assert opening_reason(opens) in texts, texts
            assert not any("is disabled" in t for t in texts), texts
            assert dt.datetime.now(dt.timezone.utc) < opens, "the window closed before the checks ended"

            # The calendar opens the queue: the job starts.
            wait_until(lambda: "r" in qstat_jobs().get(job, {}).get("states", ""), WINDOW_S + 60,
                       "the job running once the calendar opens cal.q", 1.0)
            assert dt.datetime.now(dt.timezone.utc) >= opens
            row = cal_queue_status()
            assert row["calendar_state"] == "on" and row["calendar_next_change"] is None, row
            assert row["calendar_text"] == f"{QUEUE}: calendar {CALENDAR}, open, no change ahead"
    finally:
        qdel_quietly(*jobs)
    # The window is gone with its queue.
    assert not any(name.startswith(QUEUE + "@") for name in queue_instances())
