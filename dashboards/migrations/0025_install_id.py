"""This install's id (``Install``, one row), the part of its Grid Engine job names that tells its jobs
from another install's on a shared cell (``tco-<install>-c<id>-<name>``; dashboards/core/install.py).
The row is made here with a random id; its ``created_at`` marks the campaigns launched before it,
whose jobs were named ``tco-c<id>-<name>`` (launch.submit.find_campaign_job).
"""

import django.core.validators
from django.db import migrations, models
from django.utils import timezone


def make_install(apps, schema_editor):
    """The one row, with a new random id (never the setting's: the row outlives a changed setting)."""
    from dashboards.core.install import new_install_id

    Install = apps.get_model("dashboards", "Install")
    if not Install.objects.filter(pk=1).exists():
        Install.objects.create(pk=1, install_id=new_install_id(), created_at=timezone.now())


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0024_waste_infrastructure'),
    ]

    operations = [
        migrations.CreateModel(
            name='Install',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('install_id', models.CharField(max_length=12, validators=[django.core.validators.RegexValidator('^[a-z0-9]{3,12}$')])),
                ('created_at', models.DateTimeField()),
            ],
        ),
        migrations.RunPython(make_install, migrations.RunPython.noop),
    ]
