"""AnomalyAlert: anomaly alerts kept once by their key (issue 25, dashboards.alerts)."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0018_task_identity'),
    ]

    operations = [
        migrations.CreateModel(
            name='AnomalyAlert',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=160, unique=True)),
                ('kind', models.CharField(choices=[('task_pending', 'tasks pending longer than usual'), ('task_running', 'tasks running longer than usual'), ('campaign_failures', 'a burst of failed tasks'), ('budget_burn', 'a budget spent before its period ends')], max_length=20)),
                ('severity', models.CharField(choices=[('warning', 'warning'), ('critical', 'critical')], default='warning', max_length=8)),
                ('title', models.CharField(max_length=200)),
                ('text', models.TextField()),
                ('details', models.JSONField(blank=True, default=dict)),
                ('starts_at', models.DateTimeField()),
                ('at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('budget', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='anomaly_alerts', to='dashboards.budget')),
                ('campaign', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='anomaly_alerts', to='dashboards.campaign')),
                ('task', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='dashboards.task')),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='anomaly_alerts', to='dashboards.team')),
            ],
            options={
                'ordering': ['-at', '-id'],
            },
        ),
    ]
