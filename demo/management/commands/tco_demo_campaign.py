"""Launch a demo campaign: N demo agents as one array job on agent.q.

With ``--pause``, leave a real, explainable pending job for the admin's "why is this job pending?":
the campaign is launched capped at one running task (``--concurrency-cap``, ``-tc``; default 1 with
``--pause``) and paused by its launcher through tco's control path (``campaign_control``: audited,
carried out by the submit worker). At most its first task starts before the hold lands; the others
stay held (``hqw``), said everywhere the admin looks (the landing page's queued tile, triage's
"paused by launcher in tco ... ago" with Release, the task page's "why is this pending?", the
assistant) until someone releases them. A held job takes no slot, seat or share-tree usage.

    manage.py tco_demo_campaign --count 60 --team research --user launcher --name demo \
        --model stand-in-review --endpoint demo-stand-in --once
    manage.py tco_demo_campaign --count 6 --user launcher --name nightly-eval --pause --replace

With ``--model`` and ``--endpoint``, each demo agent asks that model once through the metering proxy
(demo/demo_agent.py): the campaign's policy allows the registered endpoint only
(``demo.campaign.demo_agent_policy``), so its tokens and cost are metered and billed like any agent's.
With ``--once``, nothing is launched while a campaign of the same name that the same user launched
earlier is not over (a second ``make demo`` finds the first one's demo still running).

With ``--replace``, a campaign of the same name that the same user launched earlier and that still
has tasks on the cluster (a second ``make demo`` finds the first one's paused job still held: no
``make stop`` deletes jobs, as stopping a site's dashboard leaves its campaigns running) is cancelled
first through the same control path (``campaign_control`` "cancel": qdel by the submit worker,
audited), so paused demo jobs do not pile up on the cluster.
"""
from __future__ import annotations

import random
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboards.control.actions import campaign_control
from dashboards.control_models import ControlState
from dashboards.core.errors import Refused
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_submit
from dashboards.models import CAMPAIGN_LIVE, AgentDefinition, Campaign, ControlRequest, ModelEndpoint, Task, Team
from demo.campaign import demo_agent_policy, live_campaign


def demo_inputs(count: int, *, min_seconds: float = 3.0, max_seconds: float = 15.0, model: str = "") -> list[dict]:
    """The demo campaign's inputs: ``[{"task": n, "duration_s": seconds}]`` for n = 1..count, each duration
    drawn between ``min_seconds`` and ``max_seconds`` (0.1 s steps) from a generator seeded by ``count``
    (the same campaign at every ``make demo``), and ``"model": model`` in each when one is given (the
    agent asks it once). The launch form's example (``launch.inputs.INPUT_EXAMPLES``) is one this history
    fits."""
    rng = random.Random(count)
    return [{"task": n, "duration_s": round(rng.uniform(min_seconds, max_seconds), 1), **({"model": model} if model else {})}
            for n in range(1, count + 1)]


class Command(BaseCommand):
    help = ("Launch a demo campaign of --count demo agents for --team as --user, through the launch service "
            "(role, limits, policy, budget, audit); submitted by the submit worker. --pause: then pause it as "
            "--user, leaving a held job for triage.")

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=60)
        parser.add_argument("--team", default="research")
        parser.add_argument("--name", default="demo")
        parser.add_argument("--user", default="admin",
                            help="launch as this user (needs the launcher role on --team, or admin)")
        parser.add_argument("--min-seconds", type=float, default=3.0)
        parser.add_argument("--max-seconds", type=float, default=15.0)
        parser.add_argument("--submit-here", action="store_true",
                            help="submit through DRMAA in this process instead of the submit worker")
        parser.add_argument("--concurrency-cap", type=int, default=None, metavar="N",
                            help="at most N tasks run at once (-tc N); 1 by default with --pause")
        parser.add_argument("--model", default="",
                            help="each agent asks this model once (needs --endpoint); the demo price table prices "
                                 "stand-in-review")
        parser.add_argument("--endpoint", default="",
                            help="the registered model endpoint the agents' requests go to, through the metering "
                                 "proxy (demo-stand-in: the scripted stand-in, manage.py tco_demo_model)")
        parser.add_argument("--once", action="store_true",
                            help="launch nothing while --user's earlier campaign of --name is not over")
        parser.add_argument("--pause", action="store_true",
                            help="once submitted, pause it as --user (qhold through tco) and wait until done")
        parser.add_argument("--replace", action="store_true",
                            help="first cancel this user's earlier campaigns of --name that still have tasks on "
                                 "the cluster (through tco: audited, qdel by the submit worker)")
        parser.add_argument("--timeout", type=float, default=120.0,
                            help="with --pause: seconds to wait for the submission and for the pause")

    def handle(self, *args, **options):
        try:
            team = Team.objects.get(name=options["team"])
            agent = AgentDefinition.objects.get(name="demo-agent", version=1)
            user = get_user_model().objects.get(username=options["user"])
        except (Team.DoesNotExist, AgentDefinition.DoesNotExist, get_user_model().DoesNotExist) as exc:
            raise CommandError(f"{exc} (run manage.py tco_bootstrap first)") from exc
        if options["pause"] and options["count"] < 2:
            raise CommandError("--pause needs --count 2 or more (one task may start before the pause lands)")
        if bool(options["model"]) != bool(options["endpoint"]):
            raise CommandError("--model and --endpoint go together (the agents reach a model only through an "
                               "endpoint their policy allows)")
        endpoint = None
        if options["endpoint"]:
            endpoint = ModelEndpoint.objects.filter(name=options["endpoint"], active=True).first()
            if endpoint is None:
                raise CommandError(f"model endpoint {options['endpoint']!r} is not registered (run manage.py "
                                   "tco_bootstrap, or register it in the admin)")
        earlier = live_campaign(user=user, name=options["name"]) if options["once"] else None
        if earlier is not None:
            self.stdout.write(f"campaign {earlier.pk} ({earlier.name}) that {user.get_username()} launched earlier "
                              f"is still {earlier.status}: no second one (--once)")
            return
        if options["replace"]:
            for earlier in _still_queued(user, options["name"]):
                try:
                    request = campaign_control(user=user, campaign=earlier, action="cancel")
                except Refused as exc:  # e.g. its last tasks ended meanwhile: the new campaign goes on
                    self.stdout.write(f"campaign {earlier.pk} ({earlier.name}) of an earlier run left as it is: {exc}")
                    continue
                self.stdout.write(f"campaign {earlier.pk} ({earlier.name}, job {earlier.job_number}) of an earlier "
                                  f"run: cancel requested (control request {request.pk})")
        cap = options["concurrency_cap"] or (1 if options["pause"] else None)
        inputs = demo_inputs(options["count"], min_seconds=options["min_seconds"], max_seconds=options["max_seconds"],
                             model=options["model"])
        model_request = {} if endpoint is None else {
            "model": options["model"], "model_endpoint": endpoint.name, "policy": demo_agent_policy(endpoint=endpoint)}
        try:
            campaign = launch(user=user, request=LaunchRequest(team=team, agent_definition=agent, inputs=inputs,
                                                               name=options["name"], concurrency_cap=cap,
                                                               **model_request)).campaign
        except Refused as exc:
            raise CommandError(str(exc)) from exc
        if options["submit_here"]:
            campaign = campaign_submit(campaign_id=campaign.pk)
        self.stdout.write(f"campaign {campaign.pk} ({campaign.task_count} agents) status {campaign.status}"
                          + (f", job {campaign.job_number}" if campaign.job_number else ""))
        if options["pause"]:
            deadline = time.monotonic() + options["timeout"]
            request = _pause(user, _submitted(campaign, deadline), deadline)
            ranges = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in (request.tasks or []))
            self.stdout.write(f"campaign {campaign.pk} ({campaign.name}, job {request.job_number}): tasks "
                              f"{ranges or 'all'} paused by {user.get_username()}; they wait until someone releases "
                              "them (triage's Release, or Resume on the campaign's page)")


def _still_queued(user, name: str) -> list[Campaign]:
    """``user``'s live campaigns named ``name`` with tasks pending, held or running on the cluster (one
    whose tasks are only finishing has nothing left to cancel)."""
    return list(Campaign.objects.filter(launched_by=user, name=name, status__in=CAMPAIGN_LIVE, tasks__active=True,
                                        tasks__state__in=("pending", "held", "running", "starting", "suspended"))
                .distinct().order_by("pk"))


def _submitted(campaign: Campaign, deadline: float) -> Campaign:
    """``campaign`` once the submit worker gave it a job number and its tasks exist; CommandError when
    it was rejected or ``deadline`` (time.monotonic) passed."""
    while True:
        campaign.refresh_from_db()
        if campaign.job_number is not None and Task.objects.filter(campaign=campaign).exists():
            return campaign
        if campaign.status == "rejected":
            raise CommandError(f"campaign {campaign.pk} was rejected: {campaign.submit_error or '?'}")
        if time.monotonic() >= deadline:
            raise CommandError(f"campaign {campaign.pk} was not submitted in time (is the submit worker running? "
                               "scripts/services status)")
        time.sleep(0.5)


def _pause(user, campaign: Campaign, deadline: float) -> ControlRequest:
    """Pause ``campaign`` as ``user`` and wait for the submit worker to carry it out; CommandError when
    refused, failed or not done by ``deadline``."""
    try:
        request = campaign_control(user=user, campaign=campaign, action="pause")
    except Refused as exc:
        raise CommandError(f"campaign {campaign.pk} could not be paused: {exc}") from exc
    while True:
        request.refresh_from_db()
        if request.state == ControlState.DONE:
            return request
        if request.state not in (ControlState.QUEUED, ControlState.CLAIMED):
            raise CommandError(f"the pause of campaign {campaign.pk} ended {request.state}: {request.result}")
        if time.monotonic() >= deadline:
            raise CommandError(f"the pause of campaign {campaign.pk} was not carried out in time")
        time.sleep(0.5)
