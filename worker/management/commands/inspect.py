"""``python manage.py inspect KIND FILE [--tz ZONE]``: parse captured Grid
Engine output and print one JSON object per line (worker/inspect_cli.py).

KIND is one of qstat, job, accounting, qhost, qquota, queues. Times without a
zone in FILE are read in ``--tz``, else in ``settings.TCO_CLUSTER_TZ``
(default UTC). Needs no database.

``inspect usage FILE [--prices FILE] [--requested-model NAME]`` reads a
captured model API response (JSON body or SSE stream) and prints one JSON
object with its token buckets and cost (execution/metering/inspect_usage.py).
"""
from __future__ import annotations

import zoneinfo

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from worker import inspect_cli
from schedulers.base import SchedulerError


class Command(BaseCommand):
    help = "Parse a captured qstat/qhost/qquota/accounting output and print one JSON object per line."
    requires_system_checks: list = []
    requires_migrations_checks = False

    def add_arguments(self, parser) -> None:
        parser.add_argument("kind", choices=(*inspect_cli.KINDS, "usage"))
        parser.add_argument("file")
        parser.add_argument("--prices", default=None,
                            help="usage: a prices JSON file (model -> USD per million tokens per bucket)")
        parser.add_argument("--requested-model", default=None,
                            help="usage: the model the request asked for (used when the response names none)")
        parser.add_argument("--tz", default=None,
                            help="time zone of times without one (default: settings.TCO_CLUSTER_TZ or UTC)")

    def handle(self, *args, **options) -> None:
        self.stderr.style_func = None  # the summary line is not an error
        if options["kind"] == "usage":
            self._usage(options)
            return
        zone_name = options["tz"] or getattr(settings, "TCO_CLUSTER_TZ", "UTC") or "UTC"
        try:
            tz = zoneinfo.ZoneInfo(zone_name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise CommandError(f"unknown time zone {zone_name!r}") from exc
        try:
            inspect_cli.run(options["kind"], options["file"], tz, self.stdout, self.stderr)
        except FileNotFoundError as exc:
            raise CommandError(f"no such file: {options['file']}") from exc
        except OSError as exc:
            raise CommandError(f"cannot read {options['file']}: {exc.strerror or exc}") from exc
        except SchedulerError as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from exc

    def _usage(self, options) -> None:
        import json

        from execution.metering.inspect_usage import inspect_usage

        try:
            result = inspect_usage(options["file"], options["prices"], options["requested_model"])
        except FileNotFoundError as exc:
            raise CommandError(f"no such file: {exc.filename}") from exc
        except OSError as exc:
            raise CommandError(f"cannot read {options['file']}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result))
