"""The whole seed replay: :func:`replay` (demo/replay/__init__.py says what it runs).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from django.conf import settings
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Team
from demo.replay.options import ReplayError, ReplayOptions
from demo.replay.report import render_report, write_figure
from demo.replay.runs import bill_check, run_sweep, run_teams
from demo.replay.waiting import Ingest

__all__ = ["replay"]


def replay(*, opts: ReplayOptions, log: Callable[[str], None] = print) -> dict:
    """Run the three runs; write ``report.txt`` and ``running.html`` into ``opts.out_dir`` (default
    ``<state dir>/replay/<time>``). Returns ``{"report", "teams", "sweep", "bill", "out_dir"}``.
    Raises ReplayError (and the launch service's ActionRefused/LaunchError, SchedulerError)."""
    from django.contrib.auth import get_user_model
    import os
    import socket

    try:
        user = get_user_model().objects.get(username=opts.user)
        teams = [Team.objects.get(project="research"), Team.objects.get(project="engineering")]
    except (get_user_model().DoesNotExist, Team.DoesNotExist) as exc:
        raise ReplayError(f"{exc} (run manage.py tco_bootstrap first)") from exc
    out_dir = Path(opts.out_dir or Path(settings.STATE_DIR) / "replay" / time.strftime("%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cluster = cluster_get_default()
    ingest = Ingest(cluster)
    since = timezone.now()
    ingest.step()   # catch up first, so the loop's steps are short while the runs go
    teams_run = run_teams(user=user, opts=opts, ingest=ingest, log=log) if opts.agents else None
    if teams_run:   # kept whatever happens to run 2
        (out_dir / "report-run1.txt").write_text(render_report(teams=teams_run, sweep=None, bill=None, opts=opts,
                                                               host=f"{socket.gethostname()} ({os.cpu_count()} cores)"))
    sweep_run = run_sweep(user=user, opts=opts, ingest=ingest, out_dir=out_dir, log=log) if opts.sweep else None
    ingest.step()
    bill = bill_check(since=since, teams=teams)
    host = f"{socket.gethostname()} ({os.cpu_count()} cores)"
    report = render_report(teams=teams_run, sweep=sweep_run, bill=bill, opts=opts, host=host)
    (out_dir / "report.txt").write_text(report)
    if teams_run:
        write_figure(teams_run["running"], out_dir / "running.html")
    return {"report": report, "teams": teams_run, "sweep": sweep_run, "bill": bill, "out_dir": out_dir}
