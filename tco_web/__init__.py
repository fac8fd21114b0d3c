"""tco's Django project package: settings, Celery app, ASGI application, URLs."""
from .celery import app as celery_app

__all__ = ("celery_app",)
