"""AccountingRecord's identity also names the execution host: failed starts of one job on two
hosts (start and end 0, equal otherwise) are two records, not one read twice."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("dashboards", "0014_campaign_waiting")]

    operations = [
        migrations.AddConstraint(
            model_name="accountingrecord",
            constraint=models.UniqueConstraint(
                fields=["cluster", "job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us",
                        "hostname"],
                name="accounting_identity_host",
            ),
        ),
        migrations.RemoveConstraint(model_name="accountingrecord", name="accounting_identity"),
    ]
