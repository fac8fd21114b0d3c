"""dashboards.core.bulk.insert_like: a campaign's pending tasks in one prepared insert, on the database under test."""
from __future__ import annotations

import datetime as dt

import pytest
from django.forms.models import model_to_dict

from dashboards.core.bulk import insert_like
from dashboards.core.clusters import cluster_get_default
from dashboards.models import Task

pytestmark = pytest.mark.django_db

SUBMITTED = dt.datetime(2026, 12, 1, 18, 0, 0, 123456, tzinfo=dt.timezone.utc)


def template(job: int) -> Task:
    return Task(cluster=cluster_get_default(), job_number=job, is_array=True, name="tco-inst1-c9-demo", owner="tco",
                project="research", state="pending", state_code="qw", submitted_at=SUBMITTED,
                first_seen_at=SUBMITTED)


def comparable(task: Task) -> dict:
    values = model_to_dict(task)
    for volatile in ("id", "task_number"):
        values.pop(volatile)
    return values


def test_each_row_equals_the_row_the_orm_makes_from_the_same_fields():
    by_orm = template(41)
    by_orm.task_number = 1
    by_orm.save()
    assert insert_like(template(42), "task_number", [1, 2, 3]) == 3
    rows = list(Task.objects.filter(job_number=42).order_by("task_number"))
    assert [t.task_number for t in rows] == [1, 2, 3]
    expected = {**comparable(Task.objects.get(job_number=41)), "job_number": 42}
    for row in rows:
        assert comparable(row) == expected
        assert row.usage_flags == [] and row.runner_record is None and row.active is True
        assert row.submitted_at == SUBMITTED and row.slots == 1 and row.priority == 0.0
    # auto_now: set at the insert, as save() would
    assert all(abs((t.updated_at - by_orm.updated_at).total_seconds()) < 60 for t in rows)


def test_stored_identities_are_skipped_and_counted_out():
    assert insert_like(template(43), "task_number", [1, 2]) == 2
    Task.objects.filter(job_number=43, task_number=2).update(state="running")
    assert insert_like(template(43), "task_number", [2, 3]) == 1
    assert dict(Task.objects.filter(job_number=43).values_list("task_number", "state")) == {
        1: "pending", 2: "running", 3: "pending"}
    # An inactive (ended, purged) row does not block a new active one with the same identity.
    Task.objects.filter(job_number=43, task_number=1).update(active=False)
    assert insert_like(template(43), "task_number", [1]) == 1
    assert Task.objects.filter(job_number=43, task_number=1).count() == 2


def test_an_unknown_field_and_no_values():
    with pytest.raises(ValueError, match="no column 'tasknumber'"):
        insert_like(template(44), "tasknumber", [1])
    assert insert_like(template(44), "task_number", []) == 0
    assert not Task.objects.filter(job_number=44).exists()


def test_insert_varying_prepares_each_distinct_value_of_its_own_type():
    """Values equal as dict keys (1, 1.0, True) are prepared each as itself."""
    from dashboards.core.bulk import insert_varying

    rows = [(1, 1, 1.0, "a", True), (2, 1, 1.5, "b", False), (3, 2, 1.0, "a", True)]
    assert insert_varying(template(45), ("task_number", "slots", "priority", "name", "restarted"), rows) == 3
    got = list(Task.objects.filter(job_number=45).order_by("task_number")
               .values_list("task_number", "slots", "priority", "name", "restarted"))
    assert got == rows
    with pytest.raises(ValueError, match="no column 'nope'"):
        insert_varying(template(45), ("task_number", "nope"), [(4, 1)])
