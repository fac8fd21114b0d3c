"""Launch latency (issue 15 item 3): the launch service's call to every task in the scheduler.

For 410 and 10,000 tasks, and for three campaigns launched one right after the
other: from the call of :func:`dashboards.launch.service.launch` (role, limits, policy,
budget, audit, spool) through :func:`dashboards.launch.submit.campaign_submit` (what
the submit worker runs; here in this process, so no queue hop is counted)
until the DRMAA call returned (every task is in the scheduler then; the same
instant the replay's "launch call -> every task in the scheduler" uses, the
campaign's ``submitted_at``), beside the bare DRMAA call for the same array in
the same run; also until tco's task rows are committed right after it. Goals: <= 0.3 s for 410 tasks, <= 1 s for 10,000. Every
campaign is submitted on hold and deleted at once, so nothing runs. A fresh
SQLite database and spool in a temp dir; run as the submit account:

    source scripts/env.sh; as_tco env LD_PRELOAD=$TCO_JEMALLOC .venv/bin/python bench/bench_launch.py
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _django import setup_temp_django  # noqa: E402

GOALS = {410: 0.3, 10_000: 1.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="410,10000")
    parser.add_argument("--together", type=int, default=3, help="campaigns launched one right after the other")
    args = parser.parse_args()
    tmp = setup_temp_django("tco-bench-launch-")
    os.environ.setdefault("TCO_ADMIN_PASSWORD", "bench-admin-pw-1")
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    settings.TCO_SPOOL_DIR = tmp / "spool"
    call_command("tco_bootstrap", stdout=io.StringIO())
    from dashboards.core.clusters import cluster_get_default, scheduler_for
    from dashboards.launch.service import LaunchRequest, launch
    from dashboards.models import AgentDefinition, Campaign, Team
    from dashboards.launch.submit import campaign_submit
    from schedulers.base import ArrayJobSpec
    from schedulers.gridengine.commands import run_command

    user = get_user_model().objects.get(username="admin")
    team = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent", version=1)
    scheduler = scheduler_for(cluster_get_default())
    jobs: list[int] = []

    returned: list[float] = []   # perf_counter when each DRMAA call returned (every task in the scheduler)

    def tco_launch(count: int, name: str) -> Campaign:
        campaign = launch(user=user, request=LaunchRequest(
            team=team, agent_definition=agent, name=name,
            inputs=[{"task": n, "duration_s": 1} for n in range(1, count + 1)])).campaign
        Campaign.objects.filter(pk=campaign.pk).update(submit_on_hold=True)   # nothing runs
        campaign = campaign_submit(campaign_id=campaign.pk, scheduler=scheduler,
                                   after_submit=lambda _job: returned.append(time.perf_counter()))
        jobs.append(campaign.job_number)
        return campaign

    try:
        for count in [int(s) for s in args.sizes.split(",")]:
            spec = ArrayJobSpec(name="bench_launch_bare", command="/bin/true", args=[], count=count,
                                queue="agent.q", project="research", resources={"anthropic_api": 1},
                                environment={}, working_directory="/tmp", output_path="/dev/null",
                                error_path="/dev/null", hold=True)
            t0 = time.perf_counter()
            job, _ = scheduler.submit_array(spec)
            bare = time.perf_counter() - t0
            jobs.append(job)
            t0 = time.perf_counter()
            tco_launch(count, f"bench-{count}")
            one, rows = returned[-1] - t0, time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(args.together):
                tco_launch(count, f"bench-{count}-{i}")
            together, together_rows = returned[-1] - t0, time.perf_counter() - t0
            goal = GOALS.get(count)
            print(f"{count:>6} tasks: bare DRMAA {bare:.3f} s | launch -> in the scheduler (DRMAA returned) {one:.3f} s"
                  + (f" (goal <= {goal} s: {'met' if one <= goal else 'MISSED'})" if goal else "")
                  + f", -> tco's task rows committed {rows:.3f} s"
                  + f" | {args.together} campaigns one after the other: last in the scheduler {together:.3f} s after"
                    f" the first call ({together / args.together:.3f} s each), rows committed {together_rows:.3f} s")
            run_command(["qdel", *[str(j) for j in jobs]], timeout=120)
            jobs.clear()
    finally:
        if jobs:
            run_command(["qdel", *[str(j) for j in jobs]], timeout=120)
    print("source article: 256 tasks in the scheduler 5.2 s after the first qsub")


if __name__ == "__main__":
    main()
