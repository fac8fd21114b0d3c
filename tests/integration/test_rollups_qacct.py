"""The usage rollups against the real ``qacct -P`` on the dev cluster (issue 26, done-means 3).

Real campaigns run on the cell and end through the worker's rounds; their accounting lines are read
by tco's ingest from a snapshot of the cell's accounting file (other suites keep writing to it),
which the real ``qacct`` reads too.
Then, for every UTC day the records touch and each team's project:

* the rollups equal the detail rows they were kept from (``rollups.differences``: every sum, to
  the microsecond of wall clock and the 1e-8 USD of cost);
* the day's bill, which reads the rollups (UTC days start on whole hours), equals the same bill
  summed from the detail rows alone (tasks, records, tokens, dollars, wall clock, slot-seconds);
* its wall clock per project (tco's rows and the jobs tco did not launch under the project
  together) equals ``qacct -P PROJECT -b DAY -e DAY`` to the second;
* after the retention drop has removed every detail row of those days, the same bills give the
  same figures from the rollups alone, still equal to ``qacct -P``.
"""
from __future__ import annotations

import datetime as dt
import re
import shutil
import time

import pytest

from dashboards.billing import bills, periods
from dashboards.core import rollups
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest import retention
from dashboards.ingest.accounting import ingest_accounting
from dashboards.models import AccountingRecord, Cluster, Task, Team, UsageRollup
from tests.helpers import wait_until
from tests.integration.test_ops_cluster import qacct_wallclock, run_small_campaign

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

UTC = dt.timezone.utc
SUMS = ("tasks", "records", "finished_tasks", "verdicts", "unpriced_tasks", "input_tokens", "output_tokens",
        "cost_usd", "wallclock_s", "slot_s")


def day_sums(bill: dict) -> dict[tuple, dict]:
    """(day, project) -> the bill's sums over its rows (tco's and not tco's together, as qacct -P)."""
    out: dict[tuple, dict] = {}
    for row in bill["rows"]:
        into = out.setdefault((row["period"], row["project"]), {s: 0 for s in SUMS})
        for s in SUMS:
            into[s] += row[s]
    return out


def test_rollups_equal_detail_rows_and_qacct_before_and_after_the_detail_is_dropped(bootstrap, ops_users, tmp_path):
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    campaigns = [run_small_campaign(ops_users["launcher"], research, "roll-r", count=3),
                 run_small_campaign(ops_users["admin"], engineering, "roll-e", count=2)]
    cluster = cluster_get_default()

    def written() -> bool:
        text = open(cluster.accounting_path, errors="replace").read()
        return all(len(re.findall(rf"^[^:]*:[^:]*:[^:]*:[^:]*:[^:]*:{c.job_number}:", text, re.M)) == c.task_count
                   for c in campaigns)

    wait_until(written, 180, "the accounting records of both campaigns")
    snapshot = tmp_path / "accounting"
    shutil.copyfile(cluster.accounting_path, snapshot)
    # The worker's rounds (the poll, the runner records) end the tasks; the accounting is read from
    # the snapshot, the lines qacct reads below.
    import worker.tasks as rounds

    deadline = time.monotonic() + 180
    while True:
        rounds.poll_queue(cluster.name)
        rounds.ingest_runner_records()
        rounds.reconcile_gone_tasks()
        ingest_accounting(cluster, path=str(snapshot), time_budget_s=300)
        if not Task.objects.filter(campaign__in=campaigns, active=True).exists():
            break
        assert time.monotonic() < deadline, list(Task.objects.filter(campaign__in=campaigns).values_list("state"))
        time.sleep(0.5)
    jobs = [c.job_number for c in campaigns]
    ours = list(AccountingRecord.objects.filter(job_number__in=jobs))
    assert len(ours) == 5 and all(r.task_id for r in ours)
    assert UsageRollup.objects.filter(campaign_id__in=[c.pk for c in campaigns]).exists()
    assert rollups.differences(cluster_id=cluster.pk) == []

    Cluster.objects.filter(pk=cluster.pk).update(time_zone="UTC")
    starts = [r.started_at.astimezone(UTC) for r in ours]
    first, last = min(starts).date(), max(starts).date()
    teams = [research, engineering]

    def bill(detail: bool = False) -> dict:
        return bills.bill(teams=teams, period="day", first=first, last=last, from_detail=detail)

    kept = day_sums(bill())
    assert kept == day_sums(bill(detail=True))
    tz = periods.cluster_zone(Cluster.objects.get(pk=cluster.pk))

    def qacct_days() -> dict[tuple, float]:
        out = {}
        day = first
        while day <= last:
            begin, end = periods.period_bounds(day, "day", tz)
            for project in ("research", "engineering"):
                out[(day, project)] = qacct_wallclock(str(snapshot), project, periods.qacct_time(begin, tz),
                                                      periods.qacct_time(end - dt.timedelta(seconds=1), tz), "UTC")
            day += dt.timedelta(days=1)
        return out

    theirs = qacct_days()
    assert theirs[(starts[0].date(), "research")] > 0
    for key, wall in theirs.items():
        assert round(kept.get(key, {}).get("wallclock_s", 0.0)) == round(wall), (key, kept.get(key), wall)

    # Retention: every detail row of those days goes; the rollups alone give the same bills.
    later = dt.datetime.combine(last + dt.timedelta(days=3), dt.time(), tzinfo=UTC)
    dropped = retention.drop_old_detail(Cluster.objects.get(pk=cluster.pk), days=1, now=later, batch=2,
                                       time_budget_s=300)
    assert dropped.done and dropped.tasks >= 5 and dropped.batches >= 3, dropped
    assert not Task.objects.filter(campaign__in=campaigns).exists()
    assert not AccountingRecord.objects.filter(job_number__in=jobs).exists()
    assert day_sums(bill()) == kept
    for key, wall in theirs.items():
        assert round(kept.get(key, {}).get("wallclock_s", 0.0)) == round(wall), (key, wall)
