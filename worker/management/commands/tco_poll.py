"""``manage.py tco_poll``: the qstat poll of every cluster tco watches, in a loop of its own
(worker.poll_loop): each poll starts a poll interval after the last one started, never queued behind
other work. scripts/services starts it as ``poll`` (and the beat then does not queue ``poll_queue``)."""
from __future__ import annotations

import logging

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Poll qstat in a loop (one thread per cluster), instead of the beat's poll_queue task."

    def handle(self, *args, **options) -> None:
        from worker import poll_loop

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        poll_loop.serve()
