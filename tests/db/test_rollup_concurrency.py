"""Rollup rows under concurrent writers (issue 26): ingest, a poll's write and the retention drop at once.

PostgreSQL only (``TCO_TEST_DB=postgres scripts/test tests/db/test_rollup_concurrency.py``): SQLite has
one writer at a time, so its writers never hold row locks against each other. Three threads, each with
its own connection, write at the same moment: the accounting ingest stores records of running tasks
(ending them) and of jobs tco did not launch, a poll's writes end other tasks, set the cost of the
tasks the ingest is ending and mark stale ones lost, and the retention drop removes last month's detail
in small batches. All of them add to the same hour and day rollup rows (one campaign, four hours
across a UTC midnight, two queues). Afterwards: no writer failed (PostgreSQL reports a deadlock as an
error in one of them), every figure equals what this test put in, computed here from its own inputs (no
update lost), the rollups equal the detail rows that are left, the day rows equal their hour rows, and
the dropped month's rollup rows are unchanged.
"""
from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction

from dashboards.core import rollups
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest import retention
from dashboards.ingest.accounting import _store_records
from dashboards.ingest.poll import reconcile_gone_tasks
from dashboards.models import AccountingRecord, ModelRequest, Task, Team, UsageRollup, WasteRollup
from dashboards.rollup_models import UsageDayRollup, WasteDayRollup
from tests.db.test_rollups import parsed
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.timezone.utc
MIDNIGHT = dt.datetime(2026, 5, 5, tzinfo=UTC)
#: The hours the new usage starts in: two before a UTC midnight, two after (two day rows).
HOURS = [MIDNIGHT + dt.timedelta(hours=h) for h in (-2, -1, 0, 1)]
NOW = dt.datetime(2026, 5, 5, 12, tzinfo=UTC)
CUT = dt.datetime(2026, 4, 15, 12, tzinfo=UTC)  # NOW - 20 days


def snapshot(model, before: dt.datetime | None = None) -> dict:
    rows = model.objects.all() if before is None else model.objects.filter(**{
        ("hour__lt" if hasattr(model, "hour") else "day__lt"): before})
    return {tuple(r.values()) for r in rows.values().order_by("pk")}


def test_ingest_a_poll_and_the_retention_drop_at_once_keep_every_rollup_exact(ops_users, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("row locks between writers: PostgreSQL only (TCO_TEST_DB=postgres)")
    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="busy", job_number=7400)
    old = make_campaign(team=research, user=ops_users["launcher"], name="old", job_number=7401)

    # Last month: 60 tasks ended, with records and model requests, then jobs tco did not launch.
    old_start = dt.datetime(2026, 4, 1, 9, tzinfo=UTC)
    old_tasks = []
    for n in range(1, 61):
        began = old_start + dt.timedelta(minutes=7 * n)
        task = Task.objects.create(cluster=cluster, campaign=old, job_number=7401, task_number=n, is_array=True,
                                   state="finishing", active=True, submitted_at=began, started_at=began,
                                   gone_at=began + dt.timedelta(minutes=5), queue="agent.q",
                                   cost_usd=Decimal("0.01"), output_tokens=10)
        for seq in (1, 2):
            ModelRequest.objects.create(task=task, seq=seq, at=began, provider="anthropic", model="m", method="POST",
                                        path="/v1/messages", status=200,
                                        output_tokens=5, cost_usd=Decimal("0.005"), latency_ms=10)
        old_tasks.append(task)
    with transaction.atomic():
        _store_records(cluster, [parsed(7401, t.task_number, submitted=t.started_at, started=t.started_at,
                                        ended=t.started_at + dt.timedelta(minutes=5), wall=300, slots=1,
                                        queue="agent.q", project="research") for t in old_tasks]
                       + [parsed(9400 + n, 0, submitted=old_start, started=old_start + dt.timedelta(hours=n),
                                 ended=old_start + dt.timedelta(hours=n, seconds=30), wall=30, slots=2,
                                 queue="classic.q", project="research") for n in range(10)])
    assert Task.objects.filter(campaign=old, active=False).count() == 60
    old_rollups = {m: snapshot(m, CUT) for m in (UsageRollup, WasteRollup)}
    old_days = {m: snapshot(m, CUT) for m in (UsageDayRollup, WasteDayRollup)}
    assert old_rollups[UsageRollup] and old_days[UsageDayRollup]

    # Now: tasks the ingest ends (A), the poll ends (B) and the poll finds lost (C), in four hours.
    def make(first: int, count: int, state: str, gone: dt.datetime | None) -> list[Task]:
        out = []
        for i in range(count):
            began = HOURS[i % 4] + dt.timedelta(minutes=(i * 7) % 60, seconds=i)
            out.append(Task.objects.create(
                cluster=cluster, campaign=campaign, job_number=7400, task_number=first + i, is_array=True,
                state=state, active=True, submitted_at=began, started_at=began, gone_at=gone, queue="agent.q"))
        return out

    ingested = make(1, 48, "finishing", NOW - dt.timedelta(seconds=30))
    polled = make(101, 48, "running", None)
    lost = make(201, 16, "finishing", NOW - dt.timedelta(days=2))
    walls = {t.task_number: 100 + t.task_number + t.task_number / 1000 for t in ingested}
    records = [parsed(7400, t.task_number, submitted=t.started_at, started=t.started_at, wall=walls[t.task_number],
                      ended=t.started_at + dt.timedelta(seconds=walls[t.task_number]), slots=1 + t.task_number % 3,
                      queue=("agent.q", "classic.q")[t.task_number % 2], project="research") for t in ingested]
    others = [parsed(9500 + n, 0, submitted=HOURS[n % 4], started=HOURS[n % 4] + dt.timedelta(minutes=n),
                     ended=HOURS[n % 4] + dt.timedelta(minutes=n, seconds=45), wall=45.5, slots=1,
                     queue="classic.q", project="research") for n in range(24)]
    costs = {t.task_number: Decimal(t.task_number) / Decimal(10**6) + Decimal("0.00000001") for t in ingested + polled}

    barrier = threading.Barrier(3)
    failures: list[tuple[str, BaseException]] = []
    dropped = []

    def run(name, body):
        def target():
            try:
                barrier.wait(timeout=30)
                body()
            except BaseException as exc:  # noqa: BLE001 - every failure is reported below
                failures.append((name, exc))
            finally:
                connections.close_all()
        return threading.Thread(target=target, name=name)

    def ingest():
        for i in range(12):  # 4 records of tco's tasks and 2 of other jobs a transaction, as the ingester batches
            with transaction.atomic():
                _store_records(cluster, records[4 * i:4 * i + 4] + others[2 * i:2 * i + 2])

    def poll():
        for i in range(12):
            # The poll ends 4 tasks, and prices 4 the ingest is ending (a runner record read meanwhile).
            ended = polled[4 * i:4 * i + 4]
            priced = ingested[47 - 4 * i - 3:47 - 4 * i + 1]
            with transaction.atomic(), rollups.tasks_rolled([t.pk for t in ended + priced]):
                for t in ended:
                    Task.objects.filter(pk=t.pk).update(state="done", active=False, verdict="ok",
                                                        ended_at=t.started_at + dt.timedelta(minutes=3),
                                                        cost_usd=costs[t.task_number], output_tokens=t.task_number)
                for t in priced:
                    Task.objects.filter(pk=t.pk).update(cost_usd=costs[t.task_number], input_tokens=t.task_number)
        assert reconcile_gone_tasks(cluster, now=NOW) == 16

    def drop():
        dropped.append(retention.drop_old_detail(cluster, days=20, now=NOW, batch=2))

    threads = [run("ingest", ingest), run("poll", poll), run("drop", drop)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert failures == []

    # The drop: last month's detail gone in batches, its rollup rows (hours and days) untouched.
    assert dropped[0].cutoff == CUT and dropped[0].done and dropped[0].tasks == 60 and dropped[0].batches >= 30
    assert dropped[0].records == 70 and dropped[0].requests == 120
    assert not Task.objects.filter(campaign=old).exists()
    assert {m: snapshot(m, CUT) for m in (UsageRollup, WasteRollup)} == old_rollups
    assert {m: snapshot(m, CUT) for m in (UsageDayRollup, WasteDayRollup)} == old_days

    # No update lost: the two days' rows hold exactly what went in, computed from this test's inputs.
    new_days = UsageDayRollup.objects.filter(day__gte=MIDNIGHT - dt.timedelta(days=1))
    assert sorted(d.date() for d in new_days.values_list("day", flat=True).distinct()) == [
        dt.date(2026, 5, 4), dt.date(2026, 5, 5)]
    total = {f: sum(getattr(r, f) for r in new_days) for f in (
        "tasks", "finished_tasks", "verdicts", "cost_units", "input_tokens", "output_tokens", "records",
        "wallclock_us", "slot_us")}
    assert total == {
        "tasks": 48 + 48 + 16, "finished_tasks": 48 + 48, "verdicts": 48,
        "cost_units": sum(int(c * 10**8) for c in costs.values()),
        "input_tokens": sum(t.task_number for t in ingested), "output_tokens": sum(t.task_number for t in polled),
        "records": 48 + 24,
        "wallclock_us": sum(round(r.wallclock_s * 10**6) for r in records) + 24 * 45_500_000,
        "slot_us": sum(round(r.wallclock_s * 10**6) * r.slots for r in records) + 24 * 45_500_000}
    hours = UsageRollup.objects.filter(hour__gte=HOURS[0])
    assert sum(r.cost_units for r in hours) == total["cost_units"] and sum(r.records for r in hours) == 72
    # Everything agrees: the rollups with the detail rows left, the days with their hours.
    assert rollups.differences(since=CUT) == []
    assert rollups.waste_differences(since=CUT) == []
    assert rollups.kind_differences("requests", since=CUT) == []
    assert rollups.day_differences("usage") == [] and rollups.day_differences("waste") == []
    assert AccountingRecord.objects.filter(job_number=7400).count() == 48
    assert set(Task.objects.filter(pk__in=[t.pk for t in lost]).values_list("state", "active")) == {("lost", False)}
