"""Campaign.rerunnable: submit with ``-r y`` (a task whose host is lost is rerun elsewhere)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("dashboards", "0011_ingest_checkpoint_fingerprint")]

    operations = [
        migrations.AddField(
            model_name="campaign",
            name="rerunnable",
            field=models.BooleanField(default=False, help_text="-r y: rerun a task elsewhere if its host is lost"),
        ),
    ]
