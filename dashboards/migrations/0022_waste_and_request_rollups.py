"""Waste rollups (per hour, campaign, end state, verdict and attempt) and model-request rollups (per
hour, campaign, provider and model), kept at ingest (issue 26): the waste view, the bill's waste
figures and the FOCUS export's providers read them. The rollups of what is stored so far are made
from the detail rows (where a retention drop left no detail, those hours start empty).

The backfill is this migration's own: the models as they stand here (``apps.get_model``) and its
own sums, in Python, never the product's ``dashboards.core.rollups``, which may change later. What
it computes is what ingest keeps (``dashboards.core.rollup_sql``: ``waste_task_select``,
``waste_record_select``, ``request_select``); tests/db/test_rollup_backfill.py checks it against
sums computed in the test from the detail rows.
"""

import datetime as dt

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Exists, OuterRef

#: Costs in integers of 1e-8 USD (Task.cost_usd has 8 decimals); wall clock in integer microseconds.
COST_UNITS = 10**8
#: The disjoint token buckets: an ended task with tokens in any of them and no cost is unpriced.
BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens")


def _hour(moment):
    """The start of the UTC hour of ``moment`` (an aware datetime)."""
    return moment.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


def waste_sums(apps, db):
    """The waste rollup rows of the detail rows: {(cluster_id, hour, campaign_id, state, verdict,
    earlier): [tasks, unpriced_tasks, cost_units, records, wallclock_us, slot_us]}.

    Ended tasks of campaigns (``active`` False) that started, by the UTC hour of their start; the
    accounting records of ended campaign tasks, by the hour of the record's start, ``earlier`` when a
    record of the same task started later. The verdict is the task's where it ended done, else "".
    """
    Task = apps.get_model("dashboards", "Task")
    Record = apps.get_model("dashboards", "AccountingRecord")
    out = {}
    tasks = (Task.objects.using(db).filter(active=False, campaign__isnull=False, started_at__isnull=False)
             .values_list("cluster_id", "started_at", "campaign_id", "state", "verdict", "cost_usd", *BUCKETS))
    for cluster_id, started, campaign_id, state, verdict, cost, *tokens in tasks.iterator(chunk_size=2000):
        row = out.setdefault((cluster_id, _hour(started), campaign_id, state, verdict if state == "done" else "",
                              False), [0] * 6)
        row[0] += 1
        row[1] += int(cost is None and any((n or 0) > 0 for n in tokens))
        row[2] += int((cost * COST_UNITS).to_integral_value()) if cost is not None else 0
    later = Record.objects.filter(task_id=OuterRef("task_id"), start_us__gt=OuterRef("start_us"))
    records = (Record.objects.using(db)
               .filter(task__active=False, task__campaign__isnull=False, started_at__isnull=False)
               .annotate(earlier=Exists(later))
               .values_list("cluster_id", "started_at", "task__campaign_id", "task__state", "task__verdict",
                            "earlier", "wallclock_s", "slots"))
    for cluster_id, started, campaign_id, state, verdict, earlier, wall_s, slots in records.iterator(2000):
        row = out.setdefault((cluster_id, _hour(started), campaign_id, state, verdict if state == "done" else "",
                              bool(earlier)), [0] * 6)
        wall = round(wall_s * 1_000_000)
        row[3] += 1
        row[4] += wall
        row[5] += wall * slots
    return out


def request_sums(apps, db):
    """The request rollup rows of the detail rows: {(cluster_id, hour, campaign_id, provider, model):
    requests}, the model requests of ended campaign tasks that started, by the hour of the task's start."""
    Request = apps.get_model("dashboards", "ModelRequest")
    out = {}
    rows = (Request.objects.using(db)
            .filter(task__active=False, task__campaign__isnull=False, task__started_at__isnull=False)
            .values_list("task__cluster_id", "task__started_at", "task__campaign_id", "provider", "model"))
    for cluster_id, started, campaign_id, provider, model in rows.iterator(chunk_size=2000):
        key = (cluster_id, _hour(started), campaign_id, provider, model)
        out[key] = out.get(key, 0) + 1
    return out


def backfill(apps, schema_editor):
    """Make the waste and request rollups of what is stored from the detail rows (the rows already
    there, if any, are replaced)."""
    db = schema_editor.connection.alias
    WasteRollup = apps.get_model("dashboards", "WasteRollup")
    RequestRollup = apps.get_model("dashboards", "RequestRollup")
    WasteRollup.objects.using(db).all().delete()
    RequestRollup.objects.using(db).all().delete()
    names = ("tasks", "unpriced_tasks", "cost_units", "records", "wallclock_us", "slot_us")
    WasteRollup.objects.using(db).bulk_create(
        (WasteRollup(cluster_id=key[0], hour=key[1], campaign_id=key[2], state=key[3], verdict=key[4],
                     earlier=key[5], **dict(zip(names, sums)))
         for key, sums in waste_sums(apps, db).items()), batch_size=1000)
    RequestRollup.objects.using(db).bulk_create(
        (RequestRollup(cluster_id=key[0], hour=key[1], campaign_id=key[2], provider=key[3], model=key[4],
                       requests=count)
         for key, count in request_sums(apps, db).items()), batch_size=1000)


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0021_usage_rollups'),
    ]

    operations = [
        migrations.CreateModel(
            name='RequestRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text='start of the UTC hour the task started in')),
                ('campaign_id', models.BigIntegerField()),
                ('provider', models.CharField(blank=True, max_length=32)),
                ('model', models.CharField(blank=True, max_length=128)),
                ('requests', models.BigIntegerField(default=0)),
                ('cluster', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='dashboards.cluster')),
            ],
            options={
                'indexes': [models.Index(fields=['campaign_id', 'hour'], name='request_rollup_campaign_hour')],
                'constraints': [models.UniqueConstraint(fields=('cluster', 'hour', 'campaign_id', 'provider', 'model'), name='one_request_rollup_per_key')],
            },
        ),
        migrations.CreateModel(
            name='WasteRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text='start of the UTC hour the task (or the record) started in')),
                ('campaign_id', models.BigIntegerField()),
                ('state', models.CharField(help_text="the task's end state", max_length=10)),
                ('verdict', models.CharField(blank=True, help_text="the task's verdict, where it ended done", max_length=64)),
                ('earlier', models.BooleanField(default=False, help_text='records of an earlier attempt of the task')),
                ('tasks', models.BigIntegerField(default=0)),
                ('unpriced_tasks', models.BigIntegerField(default=0)),
                ('cost_units', models.BigIntegerField(default=0, help_text='USD x 1e8')),
                ('records', models.BigIntegerField(default=0)),
                ('wallclock_us', models.BigIntegerField(default=0)),
                ('slot_us', models.BigIntegerField(default=0)),
                ('cluster', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='dashboards.cluster')),
            ],
            options={
                'indexes': [models.Index(fields=['campaign_id', 'hour'], name='waste_rollup_campaign_hour')],
                'constraints': [models.UniqueConstraint(fields=('cluster', 'hour', 'campaign_id', 'state', 'verdict', 'earlier'), name='one_waste_rollup_per_key')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
