"""Migration 0022's backfill makes the waste and request rollups from the detail rows by itself: the
models as they stand at 0022 (the migration state's apps), its own sums, never the product's
``dashboards.core.rollups`` (which may change later); 0024's makes the waste rollups again with their
``infrastructure`` column (and their day rows), from the retention cut on. The expected rows are
computed here, in Python, from the detail rows (``tests/db/test_rollups.py``: ``waste_detail_sums``,
``request_detail_sums``)."""
from __future__ import annotations

import ast
import datetime as dt
import importlib
import random
import sys
import types

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from dashboards.core import rollups
from dashboards.models import Cluster, RequestRollup, WasteRollup
from dashboards.rollup_models import REQUEST_KEY, WASTE_SUMS
from tests.db.test_rollups import (UTC, build_history, request_detail_sums, store_a_rerun, stored_waste,
                                   waste_detail_sums)

MIGRATION = "0022_waste_and_request_rollups"
INFRASTRUCTURE = "0024_waste_infrastructure"


def backfill(name: str) -> None:
    state = MigrationLoader(connection).project_state(("dashboards", name)).apps
    migration = importlib.import_module(f"dashboards.migrations.{name}")
    migration.backfill(state, types.SimpleNamespace(connection=connection))


def test_the_backfill_of_0022_makes_the_rollups_from_the_detail_rows_on_its_own(ops_users, tmp_path):
    history = build_history(random.Random(8), tmp_path / "spool", ops_users)
    # A rerun's record of an ended task: its first record becomes an earlier attempt.
    store_a_rerun(history["cluster"], later=dt.timedelta(hours=2), wall=61.5, slots=3)
    waste_rows, request_rows = waste_detail_sums(), request_detail_sums()
    assert any(key[6] for key in waste_rows) and any(key[3] == "failed" for key in waste_rows) and request_rows
    assert any(key[5] for key in waste_rows)  # the infrastructure failed some (lost tasks, at least)
    # The rows ingest kept, spoiled (waste) and dropped (requests): the backfill makes them again.
    WasteRollup.objects.update(tasks=0, records=0)
    RequestRollup.objects.all().delete()
    backfill(MIGRATION)
    # 0022 knows no infrastructure column (the column's database default, False): its rows sum both kinds.
    assert stored_waste() == without_infrastructure(waste_rows)
    backfill(INFRASTRUCTURE)
    assert stored_waste() == waste_rows
    assert rollups.day_differences("waste") == []
    stored_requests = {(r[0], r[1].astimezone(UTC), *r[2:5]): [r[5]]
                       for r in RequestRollup.objects.values_list(*REQUEST_KEY, "requests")}
    assert stored_requests == request_rows
    # The same figures the product keeps at ingest.
    assert rollups.waste_differences() == [] and rollups.kind_differences("requests") == []


def without_infrastructure(rows: dict[tuple, list[int]]) -> dict[tuple, list[int]]:
    """Waste rollup rows (``stored_waste``'s keys) with every ``infrastructure`` key column False, summed."""
    out: dict[tuple, list[int]] = {}
    for key, sums in rows.items():
        row = out.setdefault((*key[:5], False, key[6]), [0] * len(sums))
        for i, value in enumerate(sums):
            row[i] += value
    return out


def test_0024_keeps_the_waste_rows_of_hours_before_the_retention_cut(ops_users, tmp_path):
    """The hours whose detail a retention drop removed keep their rows (all of them not infrastructure's:
    nothing is left to tell); the hours from the cut on are made again."""
    history = build_history(random.Random(9), tmp_path / "spool", ops_users)
    rows = waste_detail_sums()
    cut = dt.datetime(2026, 3, 6, tzinfo=UTC)
    Cluster.objects.filter(pk=history["cluster"].pk).update(detail_dropped_before=cut)
    # The hours before the cut as a database before 0024 holds them: no row marked infrastructure.
    old = without_infrastructure({k: v for k, v in rows.items() if k[1] < cut})
    assert old and any(k[1] >= cut for k in rows)
    WasteRollup.objects.filter(hour__lt=cut).delete()
    WasteRollup.objects.bulk_create(
        WasteRollup(cluster_id=k[0], hour=k[1], campaign_id=k[2], state=k[3], verdict=k[4], infrastructure=k[5],
                    earlier=k[6], **dict(zip(WASTE_SUMS, v))) for k, v in old.items())
    WasteRollup.objects.filter(hour__gte=cut).update(tasks=0, records=0)  # spoiled: made again
    backfill(INFRASTRUCTURE)
    assert stored_waste() == {**old, **{k: v for k, v in rows.items() if k[1] >= cut}}
    assert rollups.day_differences("waste") == []


@pytest.mark.parametrize("name", [MIGRATION, INFRASTRUCTURE])
def test_the_migration_imports_only_django_and_the_standard_library(name):
    """Anywhere in the module, a function's own imports too: no product code (dashboards, schedulers...)."""
    migration = importlib.import_module(f"dashboards.migrations.{name}")
    tree = ast.parse(open(migration.__file__).read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "django.db" in imported  # the walk sees the imports
    assert {name for name in imported
            if name.split(".")[0] != "django" and name.split(".")[0] not in sys.stdlib_module_names} == set()
