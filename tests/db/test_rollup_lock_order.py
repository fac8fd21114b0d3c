"""Every transaction writes its rollup rows in the one lock order (``dashboards.core.rollups``, "Lock order").

Two writers that add to the same rollup rows in different orders deadlock on PostgreSQL, which then
fails one of them (CI of stop 29: an accounting batch wrote the records' hours, their days, then the
ended tasks' hours again, against a poll that wrote hours then days). The concurrency test
(test_rollup_concurrency.py) can only meet that by chance; this one checks the order itself, on any
database: it records every rollup row one accounting batch writes, in the order written, and asserts
the sequence never goes back (usage hours, usage days, waste hours, waste days, request hours; each in
key order), over a batch that makes tasks from records no poll saw, stores records in several hours,
queues and days, and ends finishing tasks.
"""
from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection, transaction

from dashboards.core import rollups
from dashboards.core.clusters import cluster_get_default
from dashboards.core.rollup_sql import key_order
from dashboards.ingest.accounting import _store_records
from dashboards.models import Task, Team
from tests.db.test_rollups import parsed
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc
#: The lock order of the rollup tables (the module's "Lock order"), with each table's key width.
ORDER = {"dashboards_usagerollup": (0, 5), "dashboards_usagedayrollup": (1, 5), "dashboards_wasterollup": (2, None),
         "dashboards_wastedayrollup": (3, None), "dashboards_requestrollup": (4, None)}
INSERT = re.compile(r'INSERT INTO "?(dashboards_\w*rollup)"?', re.IGNORECASE)


def written_rows(run) -> list[tuple[str, tuple]]:
    """Run ``run()`` and return every rollup row it wrote, in order: (table, key as written)."""
    from dashboards.core.rollup_sql import SPECS, DAY_SPECS

    widths = {spec["model"]._meta.db_table: len(spec["key"]) for spec in (*SPECS.values(), *DAY_SPECS.values())}
    seen: list[tuple[str, tuple]] = []

    def wrapper(execute, sql, params, many, context):
        match = INSERT.match(sql.strip())
        if match and match.group(1) in ORDER:
            table = match.group(1)
            assert "VALUES" in sql, f"{table} written by a statement whose rows are not parameters: {sql[:200]}"
            for row in (params if many else [params]):
                seen.append((table, tuple(row[:widths[table]])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        run()
    return seen


WRITE = re.compile(r'(?:INSERT INTO|UPDATE|DELETE FROM) "?(\w+)"?', re.IGNORECASE)


def writes_after_rollups(run) -> list[str]:
    """Run ``run()`` and return the tables it wrote after its first rollup row (rollups' "Lock order":
    a transaction's rollup rows are its last writes)."""
    after: list[str] = []
    started = False

    def wrapper(execute, sql, params, many, context):
        nonlocal started
        match = WRITE.match(sql.strip())
        if match:
            if match.group(1) in ORDER:
                started = True
            elif started:
                after.append(match.group(1))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        run()
    return after


def test_an_accounting_batch_writes_its_rollup_rows_in_the_one_lock_order(ops_users):
    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="busy", status="running", job_number=7600)
    midnight = dt.datetime(2026, 5, 5, tzinfo=UTC)
    hours = [midnight + dt.timedelta(hours=h) for h in (-2, -1, 0, 1)]
    # Finishing tasks the batch ends (records in every hour, both queues), and records of tasks no
    # poll saw (the batch makes them, ended), and of jobs tco did not launch.
    finishing = []
    for n in range(1, 13):
        began = hours[n % 4] + dt.timedelta(minutes=n)
        finishing.append(Task.objects.create(
            cluster=cluster, campaign=campaign, job_number=7600, task_number=n, is_array=True, state="finishing",
            active=True, submitted_at=began, started_at=began, gone_at=began + dt.timedelta(minutes=9),
            queue="agent.q"))
    records = [parsed(7600, t.task_number, submitted=t.started_at, started=t.started_at, wall=60 + t.task_number,
                      ended=t.started_at + dt.timedelta(seconds=60 + t.task_number), slots=1,
                      queue=("agent.q", "classic.q")[t.task_number % 2], project="research") for t in finishing]
    unseen = [parsed(7600, 100 + n, submitted=hours[3 - n % 4], started=hours[3 - n % 4] + dt.timedelta(minutes=n),
                     ended=hours[3 - n % 4] + dt.timedelta(minutes=n + 1), wall=60, slots=1, queue="agent.q",
                     project="research", failed=(n % 2) * 100, exit_status=n % 2) for n in range(8)]
    others = [parsed(9600 + n, 0, submitted=hours[n % 4], started=hours[n % 4], ended=hours[n % 4] + dt.timedelta(
        seconds=30), wall=30, slots=2, queue="classic.q", project="research") for n in range(6)]

    def batch():
        with transaction.atomic():
            _store_records(cluster, unseen + records + others)

    rows = written_rows(batch)

    # The batch wrote rows of several tables and several keys (else the check below says nothing) ...
    assert {table for table, _ in rows} >= {"dashboards_usagerollup", "dashboards_usagedayrollup",
                                            "dashboards_wasterollup", "dashboards_wastedayrollup"}
    assert len({key for table, key in rows if table == "dashboards_usagerollup"}) >= 8
    # ... and never went back in the lock order.
    order = [(ORDER[table][0], key_order(key)) for table, key in rows]
    backs = [(rows[i - 1], rows[i]) for i in range(1, len(order)) if order[i] < order[i - 1]]
    assert backs == []
    # The rollups are right (the held sums were all written).
    assert rollups.differences() == [] and rollups.waste_differences() == []
    assert rollups.day_differences("usage") == [] and rollups.day_differences("waste") == []
    assert Task.objects.filter(campaign=campaign, active=False).count() == 12 + 8


def test_a_deferred_block_writes_nothing_until_it_ends_and_nothing_when_it_fails(ops_users):
    from dashboards.models import UsageRollup

    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="held", job_number=7601)
    began = dt.datetime(2026, 5, 6, 10, 5, tzinfo=UTC)
    task = Task.objects.create(cluster=cluster, campaign=campaign, job_number=7601, task_number=1, is_array=True,
                               state="running", active=True, submitted_at=began, started_at=began, queue="agent.q")

    def end():
        with rollups.tasks_rolled([task.pk]):
            Task.objects.filter(pk=task.pk).update(state="done", active=False, ended_at=began + dt.timedelta(minutes=2))

    with pytest.raises(RuntimeError), rollups.deferred():
        end()
        raise RuntimeError("the write fails after the task ended")
    assert not UsageRollup.objects.exists() and Task.objects.get(pk=task.pk).active

    # Nested: a failed inner block is a savepoint rolled back, and its held sums go with it.
    with rollups.deferred():
        with pytest.raises(RuntimeError), rollups.deferred():
            end()
            raise RuntimeError("the inner write fails")
    assert not UsageRollup.objects.exists() and Task.objects.get(pk=task.pk).active

    with rollups.deferred():
        end()
        assert not UsageRollup.objects.exists()  # held until the block ends
    row = UsageRollup.objects.get()
    assert (row.hour, row.campaign_id, row.queue, row.tasks, row.finished_tasks) == (
        dt.datetime(2026, 5, 6, 10, tzinfo=UTC), campaign.pk, "agent.q", 1, 1)


def test_a_poll_that_ends_tasks_by_their_records_writes_the_rollups_last(ops_users):
    """The poll finds finishing tasks gone whose records are read: it ends them (rollup rows), then
    follows the campaign's status and marks the cluster polled; those rows are locked first."""
    from dashboards.ingest.poll import apply_qstat_poll

    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="ends", status="running",
                             job_number=7602)
    began = dt.datetime(2026, 5, 7, 9, 5, tzinfo=UTC)
    tasks = [Task.objects.create(cluster=cluster, campaign=campaign, job_number=7602, task_number=n, is_array=True,
                                 state="running", active=True, submitted_at=began, started_at=began + dt.timedelta(
                                     hours=n % 3), queue="agent.q") for n in range(1, 7)]
    with transaction.atomic():
        _store_records(cluster, [parsed(7602, t.task_number, submitted=began, started=t.started_at, wall=40,
                                        ended=t.started_at + dt.timedelta(seconds=40), slots=1, queue="agent.q",
                                        project="research") for t in tasks])
    assert Task.objects.filter(campaign=campaign, active=True).count() == 6   # still in qstat: not ended yet

    after = writes_after_rollups(lambda: apply_qstat_poll(cluster, [], observed_at=began + dt.timedelta(hours=4)))
    assert Task.objects.filter(campaign=campaign, active=False).count() == 6   # the poll ended them
    assert after == []
    assert rollups.differences() == [] and rollups.day_differences("usage") == []
