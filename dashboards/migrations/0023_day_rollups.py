"""The day grain of the usage and waste rollups (issue 26): ``UsageDayRollup`` and ``WasteDayRollup``,
the hour rollups' sums per UTC day, kept at ingest with the hour rows; bills, the waste view and
``/api/usage/`` read a range's whole UTC days from them. The day rows of what is stored so far are
summed from the hour rows (kept for every hour, so retained hours whose detail was dropped are in them).
"""

import django.db.models.deletion
from django.db import migrations, models


def backfill(apps, schema_editor):
    """The day rows of every usage hour row stored (the same SQL as ``tco_rollups --rebuild``). The
    waste day rows are made by 0024's backfill: the product's SQL reads the waste rollups' column
    ``infrastructure``, which 0024 adds."""
    from dashboards.core import rollups

    rollups.rebuild_days("usage")


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0022_waste_and_request_rollups'),
    ]

    operations = [
        migrations.CreateModel(
            name='UsageDayRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateTimeField(help_text='00:00 UTC of the day the usage started in')),
                ('campaign_id', models.BigIntegerField(default=0, help_text='0: usage tco did not launch')),
                ('project', models.CharField(blank=True, help_text="the record's project where campaign_id is 0", max_length=64)),
                ('queue', models.CharField(blank=True, max_length=64)),
                ('tasks', models.BigIntegerField(default=0)),
                ('finished_tasks', models.BigIntegerField(default=0)),
                ('verdicts', models.BigIntegerField(default=0)),
                ('unpriced_tasks', models.BigIntegerField(default=0)),
                ('cost_units', models.BigIntegerField(default=0, help_text='USD x 1e8')),
                ('input_tokens', models.BigIntegerField(default=0)),
                ('cache_read_tokens', models.BigIntegerField(default=0)),
                ('cache_write_5m_tokens', models.BigIntegerField(default=0)),
                ('cache_write_1h_tokens', models.BigIntegerField(default=0)),
                ('output_tokens', models.BigIntegerField(default=0)),
                ('reasoning_tokens', models.BigIntegerField(default=0)),
                ('records', models.BigIntegerField(default=0)),
                ('wallclock_us', models.BigIntegerField(default=0)),
                ('slot_us', models.BigIntegerField(default=0)),
                ('cluster', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='dashboards.cluster')),
            ],
            options={
                'indexes': [models.Index(fields=['campaign_id', 'project', 'day'], name='day_rollup_campaign_day')],
                'constraints': [models.UniqueConstraint(fields=('cluster', 'day', 'campaign_id', 'project', 'queue'), name='one_day_rollup_per_key')],
            },
        ),
        migrations.CreateModel(
            name='WasteDayRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateTimeField(help_text='00:00 UTC of the day the task (or the record) started in')),
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
                'indexes': [models.Index(fields=['campaign_id', 'day'], name='waste_day_rollup_campaign_day')],
                'constraints': [models.UniqueConstraint(fields=('cluster', 'day', 'campaign_id', 'state', 'verdict', 'earlier'), name='one_waste_day_rollup_per_key')],
            },
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
