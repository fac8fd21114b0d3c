"""dashboards.core.bulk.update_by_pk: a poll's changed rows in one prepared UPDATE, on the database under test."""
from __future__ import annotations

import datetime as dt

import pytest

from dashboards.core.bulk import insert_like, update_by_pk
from dashboards.core.clusters import cluster_get_default
from dashboards.models import Task

pytestmark = pytest.mark.django_db

SUBMITTED = dt.datetime(2026, 12, 1, 18, 0, 0, 123456, tzinfo=dt.timezone.utc)
STARTED = dt.datetime(2026, 12, 1, 18, 0, 7, tzinfo=dt.timezone.utc)


def pending(job: int, n: int) -> list[Task]:
    insert_like(Task(cluster=cluster_get_default(), job_number=job, is_array=True, name="tco-inst1-c9-demo", owner="tco",
                     state="pending", state_code="qw", submitted_at=SUBMITTED, first_seen_at=SUBMITTED),
                "task_number", range(1, n + 1))
    return list(Task.objects.filter(job_number=job).order_by("task_number"))


def test_each_row_gets_its_own_values_and_the_others_are_left_alone():
    rows = pending(51, 4)
    fields = ("state", "state_code", "host", "priority", "started_at")
    updated = update_by_pk(Task, fields, [(rows[0].id, "running", "r", "node-a", 0.5, STARTED),
                                          (rows[2].id, "running", "t", "node-b", 0.25, None)])
    assert updated == 2
    got = {t.task_number: (t.state, t.state_code, t.host, t.priority, t.started_at)
           for t in Task.objects.filter(job_number=51)}
    assert got == {1: ("running", "r", "node-a", 0.5, STARTED), 2: ("pending", "qw", "", 0.0, None),
                   3: ("running", "t", "node-b", 0.25, None), 4: ("pending", "qw", "", 0.0, None)}
    # Columns not named keep their values.
    assert {t.submitted_at for t in Task.objects.filter(job_number=51)} == {SUBMITTED}


def test_the_same_as_bulk_update():
    mine, orms = pending(52, 3), pending(53, 3)
    fields = ("state", "state_code", "queue", "host", "slots", "started_at")
    values = [("running", "r", "agent.q@vm", "vm", 2, STARTED), ("error", "Eqw", "", "", 1, None),
              ("running", "Rr", "agent.q@vm", "vm", 1, STARTED + dt.timedelta(seconds=1))]
    update_by_pk(Task, fields, [(row.id, *v) for row, v in zip(mine, values)])
    for row, v in zip(orms, values):
        for f, value in zip(fields, v):
            setattr(row, f, value)
    Task.objects.bulk_update(orms, fields)
    assert ([tuple(getattr(t, f) for f in fields) for t in Task.objects.filter(job_number=52).order_by("task_number")]
            == [tuple(getattr(t, f) for f in fields) for t in Task.objects.filter(job_number=53).order_by("task_number")]
            == values)


def test_an_unknown_field_and_no_rows():
    with pytest.raises(ValueError, match="no column 'hostname'"):
        update_by_pk(Task, ("hostname",), [(1, "x")])
    assert update_by_pk(Task, ("state",), []) == 0
