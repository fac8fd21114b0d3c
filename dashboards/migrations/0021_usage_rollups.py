"""Usage rollups per hour, campaign and queue, kept at ingest (issue 26); bills read them.

Also: a cluster's own qmaster and execd ports (several cells, docs/clusters.md); indexes on the start time of tasks and accounting records (bills), the active tasks' start
(the usage not in the rollups), and ModelRequest's task index dropped (its (task, seq) constraint
serves it). The rollups of the usage stored so far are made from the detail rows.
"""

import django.db.models.deletion
from django.db import migrations, models


def backfill(apps, schema_editor):
    """The rollups of what is stored, from the detail rows (the same SQL ingest uses)."""
    from dashboards.core import rollups

    rollups.rebuild()


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0020_campaign_forecast'),
    ]

    operations = [
        migrations.CreateModel(
            name='UsageRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hour', models.DateTimeField(help_text='start of the UTC hour the usage started in')),
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
            ],
        ),
        migrations.AddField(
            model_name='cluster',
            name='qmaster_port',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='cluster',
            name='execd_port',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='cluster',
            name='detail_dropped_before',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='modelrequest',
            name='task',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='requests', to='dashboards.task'),
        ),
        migrations.AddIndex(
            model_name='accountingrecord',
            index=models.Index(fields=['cluster', 'started_at'], name='accounting_started'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(fields=['cluster', 'started_at'], name='task_started'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('active', True)), fields=['cluster', 'started_at'], name='task_active_started'),
        ),
        migrations.AddField(
            model_name='usagerollup',
            name='cluster',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='dashboards.cluster'),
        ),
        migrations.AddIndex(
            model_name='usagerollup',
            index=models.Index(fields=['campaign_id', 'project', 'hour'], name='rollup_campaign_hour'),
        ),
        migrations.AddConstraint(
            model_name='usagerollup',
            constraint=models.UniqueConstraint(fields=('cluster', 'hour', 'campaign_id', 'project', 'queue'), name='one_rollup_per_key'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('cost_usd__isnull', False)), fields=['campaign', '-cost_usd', 'task_number'], name='task_costliest'),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
