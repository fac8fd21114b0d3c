"""Cluster.poll_observed_at: when the qstat of the last applied poll began (an older snapshot is
never applied after a newer one)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("dashboards", "0015_accounting_identity_host")]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="poll_observed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
