"""The sweep-and-review demo: a parameter sweep on classic.q, then a review campaign chained to it.

    manage.py tco_sweep_review --tasks 8 --start-model --submit-here --wait 300
    manage.py tco_sweep_review --report CAMPAIGN_ID

Submits demo/demo_sweep.py as an array job on classic.q, then a review
campaign on agent.q (one sandboxed review agent per run, ``-hold_jid_ad`` on
the sweep), and with ``--wait`` prints each verdict beside the reference
checker's and the agreement. The agents talk to the registered model endpoint
``--endpoint`` (admin: Model endpoints; ``tco_bootstrap`` registers the
stand-in's, ``demo-stand-in``); ``--start-model`` starts the scripted
stand-in model (demo/demo_model.py --script review) on that endpoint's port
and gives the runners its key under the endpoint's credential name. The
launch goes through the launch service as ``--user`` (role, policy ceiling,
audit); with ``--once``, not while that user's earlier campaign of ``--name`` is live
(``make demo`` again). ``--report`` prints
the verdicts and agreement of an earlier review campaign (after ingesting its
runner records). classic.q takes no work while the host's np_load_avg is at
or above 1.75, so on a busy machine the sweep waits.
"""
from __future__ import annotations

import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboards.core.errors import Refused
from dashboards.launch.spool import team_sweeps_dir
from dashboards.launch.submit import campaign_submit
from dashboards.models import Campaign, ModelEndpoint, Task, Team
from demo.campaign import live_campaign
from demo.stand_in import StandInError, stand_in_start
from demo.sweep import review_agreement, review_runs_dir, sweep_review_launch, sweep_submit
from schedulers.base import SchedulerError


class Command(BaseCommand):
    help = "Submit the demo sweep (classic.q) and its review campaign (agent.q, -hold_jid_ad); optionally wait."

    def add_arguments(self, parser):
        parser.add_argument("--tasks", type=int, default=8)
        parser.add_argument("--team", default="research")
        parser.add_argument("--user", default="admin")
        parser.add_argument("--name", default="sweep-review")
        parser.add_argument("--out-dir", default=None,
                            help="where the sweep writes its runs (default <state dir>/sweeps/<team project>/"
                                 "<name>-<time>: the team's own sweeps, all its demo ceiling lets its agents read); "
                                 "on a real cluster a shared directory every exec host mounts")
        parser.add_argument("--endpoint", default="demo-stand-in",
                            help="name of the registered model endpoint the review agents use")
        parser.add_argument("--model", default="stand-in-review",
                            help="model id to ask for (the demo price table prices stand-in-review)")
        parser.add_argument("--start-model", action="store_true",
                            help="start the scripted stand-in model on the endpoint's (loopback) port")
        parser.add_argument("--model-fd", type=int, default=None, metavar="FD",
                            help="with --start-model: serve on this inherited listening socket, bound to the "
                                 "endpoint's address and privileged port by root (scripts/listen-as, as "
                                 "scripts/demo does), so that no other local account can take the port over")
        parser.add_argument("--submit-here", action="store_true",
                            help="submit the review campaign in this process instead of the submit worker")
        parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                            help="wait up to this long for the reviews, then print verdicts and agreement")
        parser.add_argument("--once", action="store_true",
                            help="do nothing when --user already has a live campaign of --name (a second "
                                 "make demo launches no second sweep while the first one's reviews go on)")
        parser.add_argument("--report", type=int, default=None, metavar="CAMPAIGN_ID",
                            help="only print the verdicts and agreement of this review campaign")

    def handle(self, *args, **options):
        if options["report"] is not None:
            try:
                campaign = Campaign.objects.select_related("cluster").get(pk=options["report"])
            except Campaign.DoesNotExist as exc:
                raise CommandError(f"no campaign {options['report']}") from exc
            return self._wait_and_report(campaign, review_runs_dir(campaign), campaign.task_count, 0.0)
        try:
            team = Team.objects.get(name=options["team"])
            user = get_user_model().objects.get(username=options["user"])
        except (Team.DoesNotExist, get_user_model().DoesNotExist) as exc:
            raise CommandError(f"{exc} (run manage.py tco_bootstrap first)") from exc
        count = options["tasks"]
        if not 1 <= count <= 1000:
            raise CommandError("--tasks: 1 to 1000")
        name = options["name"]
        out_dir = Path(options["out_dir"] or team_sweeps_dir(team.project) / f"{name}-{int(time.time())}")
        endpoint = ModelEndpoint.objects.filter(name=options["endpoint"], active=True).first()
        if endpoint is None:
            raise CommandError(f"model endpoint {options['endpoint']!r} is not registered (run manage.py "
                               "tco_bootstrap, or register it in the admin)")
        if options["start_model"]:
            self._start_model(endpoint, listen_fd=options["model_fd"])
        earlier = live_campaign(user=user, name=name) if options["once"] else None
        if earlier is not None:
            self.stdout.write(f"review: campaign {earlier.pk} ({earlier.name}) that {user.get_username()} launched "
                              f"earlier is still {earlier.status}: no second sweep (--once)")
            return

        try:
            sweep_job, _ = sweep_submit(team=team, count=count, out_dir=out_dir, name=name)
        except SchedulerError as exc:
            raise CommandError(f"the sweep was not submitted: {exc}") from exc
        self.stdout.write(f"sweep: job {sweep_job}, {count} tasks on classic.q, runs in {out_dir}")
        try:
            campaign = sweep_review_launch(user=user, team=team, sweep_job=sweep_job, runs_dir=out_dir, count=count,
                                           endpoint=endpoint.name, name=name, model=options["model"])
        except Refused as exc:
            raise CommandError(str(exc)) from exc
        if options["submit_here"]:
            campaign = campaign_submit(campaign_id=campaign.pk)
        self.stdout.write(f"review: campaign {campaign.pk} ({count} agents on agent.q, -hold_jid_ad {sweep_job}), "
                          f"status {campaign.status}" + (f", job {campaign.job_number}" if campaign.job_number else ""))
        if options["wait"]:
            self._wait_and_report(campaign, out_dir, count, options["wait"])

    def _start_model(self, endpoint: ModelEndpoint, listen_fd: int | None = None) -> str:
        try:
            url, pid = stand_in_start(endpoint=endpoint, listen_fd=listen_fd, warn=self.stderr.write)
        except StandInError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"stand-in model (scripted, not a real model): {url}, pid {pid}")
        return url

    def _wait_and_report(self, campaign, out_dir: Path, count: int, timeout: float) -> None:
        from dashboards.ingest.runner_records import ingest_runner_records

        deadline = time.monotonic() + timeout
        quarantined = 0
        while True:
            quarantined += ingest_runner_records(campaign.cluster).quarantined
            if Task.objects.filter(campaign=campaign, teardown_done_at__isnull=False).count() >= count \
                    or time.monotonic() >= deadline:
                break
            time.sleep(1)
        if quarantined:
            self.stdout.write(f"runner records refused and quarantined (malformed or of an unknown version): "
                              f"{quarantined}")
        result = review_agreement(campaign=campaign, runs_dir=out_dir)
        self.stdout.write("task  agent  reference (reason)")
        for row in result["rows"]:
            self.stdout.write(f"{row['task']:>4}  {str(row['agent']):<5}  {row['reference']} ({row['reason']})"
                              + ("" if row["agreed"] else "   <- disagree"))
        shown = "n/a" if result["agreement"] is None else f"{result['agreement']:.0%}"
        self.stdout.write(f"agreement with the reference checker: {result['agreed']}/{result['total']} ({shown})")
        self.stdout.write(result["caveat"])
        if result["pending"]:
            self.stdout.write(f"{result['pending']} of {count} reviews have not reported yet (the sweep may be "
                              f"waiting for classic.q: see qstat -j); later: manage.py tco_sweep_review "
                              f"--report {campaign.pk}")
