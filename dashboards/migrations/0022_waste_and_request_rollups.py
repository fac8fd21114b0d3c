"""Waste rollups (per hour, campaign, end state, verdict and attempt) and model-request rollups (per
hour, campaign, provider and model), kept at ingest (issue 26): the waste view, the bill's waste
figures and the FOCUS export's providers read them. The rollups of what is stored so far are made
from the detail rows (where a retention drop left no detail, those hours start empty).
"""

import django.db.models.deletion
from django.db import migrations, models


def backfill(apps, schema_editor):
    """The rollups of what is stored, from the detail rows (the same SQL ingest uses)."""
    from dashboards.core import rollups

    rollups.rebuild_waste()
    rollups.rebuild_requests()


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
