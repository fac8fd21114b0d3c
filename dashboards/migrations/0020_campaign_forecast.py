"""Campaign.forecast: the launch forecast as it stood when the campaign was launched (start, finish,
cost range), so the campaign page can set it beside the outcome."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("dashboards", "0019_anomaly_alert")]

    operations = [
        migrations.AddField(
            model_name="campaign",
            name="forecast",
            field=models.JSONField(blank=True, null=True,
                                   help_text="the launch forecast at launch (launch.forecast_record)"),
        ),
    ]
