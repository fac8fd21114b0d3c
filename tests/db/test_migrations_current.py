"""The migrations hold every model as the code defines it: models moved between modules (``team_models``,
``control_models``) or key columns moved into an abstract base (``HourRollup``) need no migration."""
from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command

from dashboards.models import AuditEntry, Budget, ControlRequest, Membership, RequestRollup, UsageRollup, WasteRollup
from dashboards.rollup_models import HourRollup


@pytest.mark.django_db
@pytest.mark.db_independent  # the migration files against the models; the database only lists what was applied
def test_the_models_need_no_new_migration(capsys):
    # --check exits 1 (SystemExit, the test fails) when the models differ from the migrations' state.
    call_command("makemigrations", "--check", "--dry-run", verbosity=1)
    assert "No changes detected" in capsys.readouterr().out


def test_moved_models_keep_their_app_and_tables():
    assert {m._meta.db_table for m in (Membership, Budget, AuditEntry, ControlRequest)} == {
        "dashboards_membership", "dashboards_budget", "dashboards_auditentry", "dashboards_controlrequest"}
    assert {m._meta.app_label for m in (Membership, Budget, AuditEntry, ControlRequest)} == {"dashboards"}


def test_each_rollup_keeps_its_key_columns_and_names_its_key():
    hour = dt.datetime(2026, 1, 2, 3, tzinfo=dt.timezone.utc)
    for model in (UsageRollup, WasteRollup, RequestRollup):
        assert issubclass(model, HourRollup) and model._meta.app_label == "dashboards"
        cluster = model._meta.get_field("cluster")
        assert cluster.related_model._meta.label == "dashboards.Cluster" and not cluster.db_index
    assert UsageRollup._meta.get_field("campaign_id").default == 0
    assert WasteRollup._meta.get_field("hour").help_text == "start of the UTC hour the task (or the record) started in"
    assert str(UsageRollup(cluster_id=1, hour=hour, campaign_id=5, project="p", queue="q")) == (
        "1 2026-01-02 03h campaign 5 p q")
    assert str(WasteRollup(cluster_id=1, hour=hour, campaign_id=5, state="done", verdict="ok")) == (
        "1 2026-01-02 03h campaign 5 done ok")
    assert str(RequestRollup(cluster_id=1, hour=hour, campaign_id=5, provider="anthropic", model="m")) == (
        "1 2026-01-02 03h campaign 5 anthropic m")
