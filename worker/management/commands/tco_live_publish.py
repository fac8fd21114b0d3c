"""``manage.py tco_live_publish``: the live views' one producer (dashboards.live.publish; docs/live.md).

Runs until SIGTERM: after each change the writers mark (the poll, the launch, the ingest), it builds
every watched live view once per audience and publishes the finished snapshots through Redis, where
the web processes forward them to their sockets. scripts/services starts it as ``live``; a site runs
``tco-live.service``. One is enough, and one at a time is what keeps each view's sequence in order.
"""
from __future__ import annotations

import logging

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Build and publish the live views after each change (one process per site)."

    def handle(self, *args, **options) -> None:
        from dashboards.live import publish

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        publish.serve()
