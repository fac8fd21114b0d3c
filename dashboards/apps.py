from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "dashboards"
    verbose_name = "tco dashboards"

    def ready(self) -> None:
        from dashboards.core import realtime

        realtime.connect_signals()
