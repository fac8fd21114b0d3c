"""Migration 0022's backfill makes the waste and request rollups from the detail rows by itself: the
models as they stand at 0022 (the migration state's apps), its own sums, never the product's
``dashboards.core.rollups`` (which may change later). The expected rows are computed here, in Python,
from the detail rows (``tests/db/test_rollups.py``: ``waste_detail_sums``, ``request_detail_sums``)."""
from __future__ import annotations

import ast
import datetime as dt
import importlib
import random
import sys
import types

from django.db import connection
from django.db.migrations.loader import MigrationLoader

from dashboards.core import rollups
from dashboards.models import RequestRollup, WasteRollup
from dashboards.rollup_models import REQUEST_KEY
from tests.db.test_rollups import (UTC, build_history, request_detail_sums, store_a_rerun, stored_waste,
                                   waste_detail_sums)

MIGRATION = "0022_waste_and_request_rollups"


def test_the_backfill_of_0022_makes_the_rollups_from_the_detail_rows_on_its_own(ops_users, tmp_path):
    history = build_history(random.Random(8), tmp_path / "spool", ops_users)
    # A rerun's record of an ended task: its first record becomes an earlier attempt.
    store_a_rerun(history["cluster"], later=dt.timedelta(hours=2), wall=61.5, slots=3)
    waste_rows, request_rows = waste_detail_sums(), request_detail_sums()
    assert any(key[5] for key in waste_rows) and any(key[3] == "failed" for key in waste_rows) and request_rows
    # The rows ingest kept, spoiled (waste) and dropped (requests): the backfill makes them again.
    WasteRollup.objects.update(tasks=0, records=0)
    RequestRollup.objects.all().delete()
    state = MigrationLoader(connection).project_state(("dashboards", MIGRATION)).apps
    migration = importlib.import_module(f"dashboards.migrations.{MIGRATION}")
    migration.backfill(state, types.SimpleNamespace(connection=connection))
    assert stored_waste() == waste_rows
    stored_requests = {(r[0], r[1].astimezone(UTC), *r[2:5]): [r[5]]
                       for r in RequestRollup.objects.values_list(*REQUEST_KEY, "requests")}
    assert stored_requests == request_rows
    # The same figures the product keeps at ingest.
    assert rollups.waste_differences() == [] and rollups.kind_differences("requests") == []


def test_the_migration_imports_only_django_and_the_standard_library():
    """Anywhere in the module, a function's own imports too: no product code (dashboards, schedulers...)."""
    migration = importlib.import_module(f"dashboards.migrations.{MIGRATION}")
    tree = ast.parse(open(migration.__file__).read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "django.db" in imported  # the walk sees the imports
    assert {name for name in imported
            if name.split(".")[0] != "django" and name.split(".")[0] not in sys.stdlib_module_names} == set()
