"""The qmaster stopped in the middle of a campaign, then started again.

While it is down: every poll fails and is recorded; the pages say
"scheduler unreachable since T" and keep the last known state; no task is
marked failed, finished or lost because a poll failed. The campaign's tasks
end while the qmaster is down (their execd keeps the reports). Once it is
back, everything catches up by itself (the same periodic rounds, nothing
restarted by hand): every task done, and every accounting record of the job
in the database once.
"""
from __future__ import annotations

import datetime as dt
import time

import pytest
from django.test import Client
from django.utils import timezone

from dashboards import health
from dashboards.models import Campaign, Task, TaskEvent, Team
from dashboards.services import cluster_get_default
from tests.conftest import make_campaign

from .conftest import poll_cycle, qmaster_start, qmaster_stop, submit_as_tco, wait_for
from .ledger import compare, report

pytestmark = [pytest.mark.integration]

N_TASKS = 6
SLEEP_S = 20
OUTAGE_S = 45


def test_a_qmaster_outage_mid_campaign_loses_nothing_and_catches_up(fault_db, root_only, django_user_model):
    from django.conf import settings

    cluster = cluster_get_default()
    admin = django_user_model.objects.get(username="admin")
    job = submit_as_tco("-q", "agent.q", "-P", "research", "-l", "anthropic_api=1", "-N", "fault-qmaster",
                        "-b", "y", "-o", "/dev/null", "-e", "/dev/null", "-t", f"1-{N_TASKS}",
                        "/bin/sleep", str(SLEEP_S))
    campaign = make_campaign(team=Team.objects.get(project="research"), user=admin, name="fault-qmaster",
                             job_number=job, tasks=[])
    Campaign.objects.filter(pk=campaign.pk).update(task_count=N_TASKS)
    tasks = Task.objects.filter(campaign=campaign)

    def all_running():
        poll_cycle(cluster)
        return tasks.filter(state="running").count() == N_TASKS

    wait_for("the campaign's tasks to run", all_running, 120)
    page = Client()
    page.force_login(admin)
    stopped_at = timezone.now()
    try:
        qmaster_stop()
        # The outage: the periodic rounds go on; the tasks end meanwhile (sleep SLEEP_S < OUTAGE_S).
        failures = 0
        deadline = time.monotonic() + OUTAGE_S
        while time.monotonic() < deadline:
            failures += not poll_cycle(cluster)
            assert sorted(tasks.values_list("state", "active").distinct()) == [("running", True)]
            time.sleep(1)
        assert failures >= 5
        [outage] = health.scheduler_unreachable()
        assert outage.since >= stopped_at
        body = page.get("/").content.decode()
        assert f"unreachable since {outage.since.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC" in body
        assert page.get(f"/campaigns/{campaign.pk}/").status_code == 200
        cluster.refresh_from_db()
        assert cluster.poll_error_at == outage.since  # the first failure, not the latest
    finally:
        qmaster_start()
    restarted_at = time.monotonic()

    # Catch-up, by the same rounds alone (bounded: the execd may take minutes to re-register).
    listed_after_end = 0

    def caught_up():
        nonlocal listed_after_end
        poll_cycle(cluster)
        listed_after_end += tasks.filter(state="running").exists()
        return not tasks.filter(active=True).exists()

    wait_for("every task to end after the qmaster returned", caught_up, 480, step=1)
    caught_up_s = time.monotonic() - restarted_at
    print(f"qmaster outage: caught up {caught_up_s:.0f} s after the restart; tasks still listed as running "
          f"in {listed_after_end} polls after it")
    assert health.scheduler_unreachable() == []
    assert sorted(tasks.values_list("task_number", "state")) == [(n, "done") for n in range(1, N_TASKS + 1)]
    bad = TaskEvent.objects.filter(task__campaign=campaign, to_state__in=("failed", "lost", "deleted", "error"))
    assert not bad.exists(), list(bad.values_list("task__task_number", "from_state", "to_state"))
    assert Campaign.objects.get(pk=campaign.pk).status == "finished"
    result = compare(cluster, [settings.TCO_ACCOUNTING_FILE], jobs={job})
    report(result, f"qmaster stopped {OUTAGE_S} s mid-campaign (caught up {caught_up_s:.0f} s after restart)")
    assert (result["lost"], result["doubled"], result["extra"], result["records"]) == (0, 0, 0, N_TASKS), result
