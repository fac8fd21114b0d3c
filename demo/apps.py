"""The demo package as a Django app: it hosts the demo management commands, no models."""
from django.apps import AppConfig


class DemoConfig(AppConfig):
    """Demo commands (``tco_demo_campaign``, ``tco_sweep_review``, ``tco_demo_users``)."""

    name = "demo"
    verbose_name = "tco demo"
