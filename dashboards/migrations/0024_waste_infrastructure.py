"""The waste rollups keep whether tco's infrastructure failed each task (issue 23/22): the key column
``infrastructure`` (``dashboards.core.failures``: a lost task, a scheduler's infrastructure code, tco's
runner without a record, a metering proxy that never listened), so the waste view shows those tasks
apart from the team's waste, over retained hours too.

The backfill is this migration's own (as 0022's): the models as they stand here and its own rule, in
Python, never the product's ``dashboards.core.rollups``, which may change later. Each cluster's waste
hour rows are made again from the detail rows from its retention cut on (``detail_dropped_before``;
the hours before it have no detail left and keep their rows, none of them marked infrastructure); the
day rows are then summed from the hour rows. 0023's backfill of the waste day rows is this one's now
(the product's SQL it ran reads this column).
"""
import datetime as dt

from django.db import migrations, models
from django.db.models import Exists, OuterRef

COST_UNITS = 10**8
BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens")
#: core.failures.INFRASTRUCTURE_CODES as of this migration.
INFRASTRUCTURE_CODES = frozenset(set(range(1, 17)) | set(range(18, 30)) | set(range(31, 37)) | {38})
NOT_THE_PROXYS_FLAGS = ("runner_signalled", "memory_limit", "file_size_limit", "cpu_limit", "workdir_over_quota")
SUMS = ("tasks", "unpriced_tasks", "cost_units", "records", "wallclock_us", "slot_us")
UTC = dt.timezone.utc


def infrastructure(state, failed_code, exit_status, runner):
    """Whether tco's infrastructure failed the task (core.failures.failure_of's rule as of this migration)."""
    if state == "lost":
        return True
    if state != "failed":
        return False
    if failed_code in INFRASTRUCTURE_CODES:
        return True
    if runner is None:
        return failed_code == 0 and exit_status == 70
    if failed_code or not isinstance(runner, dict):
        return False
    flags = runner.get("flags") if isinstance(runner.get("flags"), list) else []
    return ("proxy_error" in flags and runner.get("requests_path") is None
            and not any(f in flags for f in NOT_THE_PROXYS_FLAGS))


def waste_sums(apps, db, cluster_id, since):
    """{(hour, campaign_id, state, verdict, infrastructure, earlier): [SUMS]} of one cluster's detail
    rows from ``since`` (or all), as 0022's ``waste_sums`` with the infrastructure column."""
    Task = apps.get_model("dashboards", "Task")
    Record = apps.get_model("dashboards", "AccountingRecord")
    out = {}
    tasks = Task.objects.using(db).filter(cluster_id=cluster_id, active=False, campaign__isnull=False,
                                          started_at__isnull=False)
    records = Record.objects.using(db).filter(cluster_id=cluster_id, task__active=False, task__campaign__isnull=False,
                                              started_at__isnull=False)
    if since is not None:
        tasks, records = tasks.filter(started_at__gte=since), records.filter(started_at__gte=since)
    infra = {}
    for pk, started, campaign_id, state, verdict, code, status, runner, cost, *tokens in tasks.values_list(
            "id", "started_at", "campaign_id", "state", "verdict", "failed_code", "exit_status", "runner_record",
            "cost_usd", *BUCKETS).iterator(chunk_size=2000):
        infra[pk] = infrastructure(state, code, status, runner)
        row = out.setdefault((_hour(started), campaign_id, state, verdict if state == "done" else "", infra[pk],
                              False), [0] * 6)
        row[0] += 1
        row[1] += int(cost is None and any((n or 0) > 0 for n in tokens))
        row[2] += int((cost * COST_UNITS).to_integral_value()) if cost is not None else 0
    later = Record.objects.filter(task_id=OuterRef("task_id"), start_us__gt=OuterRef("start_us"))
    for started, campaign_id, state, verdict, code, status, runner, earlier, wall_s, slots in (
            records.annotate(earlier=Exists(later))
            .values_list("started_at", "task__campaign_id", "task__state", "task__verdict", "task__failed_code",
                         "task__exit_status", "task__runner_record", "earlier", "wallclock_s", "slots")
            .iterator(chunk_size=2000)):
        key = (_hour(started), campaign_id, state, verdict if state == "done" else "",
               infrastructure(state, code, status, runner), bool(earlier))
        row = out.setdefault(key, [0] * 6)
        wall = round(wall_s * 1_000_000)
        row[3] += 1
        row[4] += wall
        row[5] += wall * slots
    return out


def _hour(moment):
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def backfill(apps, schema_editor):
    """Each cluster's waste hour rows again from its detail rows (from its retention cut on), then every
    waste day row from the hour rows."""
    db = schema_editor.connection.alias
    Cluster = apps.get_model("dashboards", "Cluster")
    WasteRollup = apps.get_model("dashboards", "WasteRollup")
    WasteDayRollup = apps.get_model("dashboards", "WasteDayRollup")
    for cluster_id, since in Cluster.objects.using(db).values_list("id", "detail_dropped_before"):
        stored = WasteRollup.objects.using(db).filter(cluster_id=cluster_id)
        (stored.filter(hour__gte=since) if since is not None else stored).delete()
        WasteRollup.objects.using(db).bulk_create(
            (WasteRollup(cluster_id=cluster_id, hour=key[0], campaign_id=key[1], state=key[2], verdict=key[3],
                         infrastructure=key[4], earlier=key[5], **dict(zip(SUMS, sums)))
             for key, sums in waste_sums(apps, db, cluster_id, since).items() if any(sums)), batch_size=1000)
    days = {}
    for row in WasteRollup.objects.using(db).values_list("cluster_id", "hour", "campaign_id", "state", "verdict",
                                                         "infrastructure", "earlier", *SUMS).iterator(chunk_size=2000):
        key = (row[0], row[1].astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0), *row[2:7])
        sums = days.setdefault(key, [0] * 6)
        for i, value in enumerate(row[7:]):
            sums[i] += value
    WasteDayRollup.objects.using(db).all().delete()
    WasteDayRollup.objects.using(db).bulk_create(
        (WasteDayRollup(cluster_id=key[0], day=key[1], campaign_id=key[2], state=key[3], verdict=key[4],
                        infrastructure=key[5], earlier=key[6], **dict(zip(SUMS, sums)))
         for key, sums in days.items()), batch_size=1000)


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0023_day_rollups'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='wastedayrollup',
            name='one_waste_day_rollup_per_key',
        ),
        migrations.RemoveConstraint(
            model_name='wasterollup',
            name='one_waste_rollup_per_key',
        ),
        migrations.AddField(
            model_name='wastedayrollup',
            name='infrastructure',
            field=models.BooleanField(db_default=False, default=False, help_text="tco's infrastructure failed the task (core.failures)"),
        ),
        migrations.AddField(
            model_name='wasterollup',
            name='infrastructure',
            field=models.BooleanField(db_default=False, default=False, help_text="tco's infrastructure failed the task (core.failures)"),
        ),
        migrations.AddConstraint(
            model_name='wastedayrollup',
            constraint=models.UniqueConstraint(fields=('cluster', 'day', 'campaign_id', 'state', 'verdict', 'infrastructure', 'earlier'), name='one_waste_day_rollup_per_key'),
        ),
        migrations.AddConstraint(
            model_name='wasterollup',
            constraint=models.UniqueConstraint(fields=('cluster', 'hour', 'campaign_id', 'state', 'verdict', 'infrastructure', 'earlier'), name='one_waste_rollup_per_key'),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
