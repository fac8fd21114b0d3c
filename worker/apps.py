from django.apps import AppConfig


class WorkerConfig(AppConfig):
    """The worker package as a Django app: it hosts management commands, no models."""

    name = "worker"
    verbose_name = "tco workers"
