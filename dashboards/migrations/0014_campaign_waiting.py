"""Campaign status ``waiting``: every waiting task waits for its ``-hold_jid_ad`` predecessor's task
(trial 4, finding 2: such a campaign showed as ``paused`` and offered a release that moves nothing)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("dashboards", "0013_reservations")]

    operations = [
        migrations.AlterField(
            model_name="campaign",
            name="status",
            field=models.CharField(choices=[("submitting", "submitting"), ("submitted", "submitted (waiting)"),
                                            ("running", "running"), ("paused", "paused (held)"),
                                            ("waiting", "waiting for its predecessor"),
                                            ("rejected", "rejected by the scheduler"), ("finished", "finished")],
                                   default="submitting", max_length=12),
        ),
    ]
