"""Campaign.job_name: the array job's name, fixed by the first submission claim
(launch.submit.campaign_job_name), so a retried claim or the reconciler finds the job under the
name it was submitted with even after TCO_INSTALL_ID or the campaign's name changed. Empty for
campaigns claimed before: their name is computed as before."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0025_install_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='campaign',
            name='job_name',
            field=models.CharField(blank=True, max_length=64),
        ),
    ]
