"""Replay the source article's runs through tco and print its table beside ours (issue 15).

    manage.py tco_replay_seed                      # 410 agents, 256-run sweep, the bill
    manage.py tco_replay_seed --agents 6 --sweep 4 --work-scale 0.05 --submit-here --watchers 4

Needs what ``make demo`` starts: the submit worker (or ``--submit-here``) and
the stand-in model on the registered endpoint (``--endpoint``) and, unless
``--no-live``, the web server (``--web-url``): run 1 is watched from qstat
and by an admin's and ``--watchers`` other users' WebSocket clients (issue 15
items 4 and 5; demo/watch.py). It runs its
own ingest loop (qstat poll, runner records, accounting) while it waits, safe
beside the workers'. Writes ``report.txt`` and ``running.html`` (Plotly, with
plotly.min.js beside it, no CDN) into ``--out-dir`` and prints the report.
Logic: demo/replay.py.
"""
from __future__ import annotations

import re
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dashboards.core.errors import ActionRefused, LaunchError
from demo.replay import ReplayError, ReplayOptions, replay
from schedulers.base import SchedulerError


class Command(BaseCommand):
    help = "Run the source article's three runs through tco on the cluster and print its table beside ours."

    def add_arguments(self, parser):
        parser.add_argument("--agents", type=int, default=410, help="agents of the two-team run (0 skips it)")
        parser.add_argument("--sweep", type=int, default=256, help="sweep runs and review agents (0 skips it)")
        parser.add_argument("--work-scale", type=float, default=1.0,
                            help="factor on the demo agents' work median (21.9 s), for short runs")
        parser.add_argument("--submit-here", action="store_true",
                            help="submit in this process instead of waiting for the submit worker")
        parser.add_argument("--user", default="admin", help="launch as this user (launcher and urgent, or admin)")
        parser.add_argument("--endpoint", default="demo-stand-in", help="the stand-in model's registered endpoint")
        parser.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS",
                            help="the longest to wait for one run")
        parser.add_argument("--out-dir", default=None, help="where report.txt and running.html go")
        parser.add_argument("--no-live", action="store_true",
                            help="do not watch run 1 from qstat and the browser (items 4 and 5 of issue 15)")
        parser.add_argument("--watchers", type=int, default=50,
                            help="WebSocket clients of both teams watching run 1 besides the admin's "
                                 "(0: the admin's only)")
        parser.add_argument("--web-url", default=None,
                            help="tco's web server for the watchers (default http://127.0.0.1:$TCO_PORT)")

    def handle(self, *args, **options):
        if not 0 <= options["agents"] <= 10000 or not 0 <= options["sweep"] <= 1000:
            raise CommandError("--agents: 0 to 10000, --sweep: 0 to 1000")
        if not 0 < options["work_scale"] <= 10:
            raise CommandError("--work-scale: above 0, at most 10")
        if not 0 <= options["watchers"] <= 500:
            raise CommandError("--watchers: 0 to 500")
        web_url = options["web_url"]
        if web_url is not None and not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+/?", web_url):
            raise CommandError("--web-url: http(s)://host[:port]")
        opts = ReplayOptions(agents=options["agents"], sweep=options["sweep"], work_scale=options["work_scale"],
                             submit_here=options["submit_here"], timeout_s=options["timeout"],
                             endpoint=options["endpoint"], user=options["user"],
                             out_dir=Path(options["out_dir"]) if options["out_dir"] else None,
                             live=not options["no_live"], watchers=options["watchers"], web_url=web_url)
        try:
            result = replay(opts=opts, log=self.stderr.write)
        except (ReplayError, ActionRefused, LaunchError, SchedulerError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(result["report"])
        self.stdout.write(f"report: {result['out_dir'] / 'report.txt'}"
                          + (f"; figure: {result['out_dir'] / 'running.html'}" if result["teams"] else ""))
