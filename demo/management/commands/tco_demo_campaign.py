"""Launch the demo campaign: N demo agents as one array job on agent.q."""
from __future__ import annotations

import random

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboards.core.errors import Refused
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_submit
from dashboards.models import AgentDefinition, Team


class Command(BaseCommand):
    help = ("Launch a demo campaign of --count demo agents for --team as --user, through the launch service "
            "(role, limits, policy, budget, audit); submitted by the submit worker.")

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

    def handle(self, *args, **options):
        try:
            team = Team.objects.get(name=options["team"])
            agent = AgentDefinition.objects.get(name="demo-agent", version=1)
            user = get_user_model().objects.get(username=options["user"])
        except (Team.DoesNotExist, AgentDefinition.DoesNotExist, get_user_model().DoesNotExist) as exc:
            raise CommandError(f"{exc} (run manage.py tco_bootstrap first)") from exc
        rng = random.Random(options["count"])
        inputs = [
            {"task": n, "duration_s": round(rng.uniform(options["min_seconds"], options["max_seconds"]), 1)}
            for n in range(1, options["count"] + 1)
        ]
        try:
            campaign = launch(user=user, request=LaunchRequest(team=team, agent_definition=agent, inputs=inputs,
                                                               name=options["name"])).campaign
        except Refused as exc:
            raise CommandError(str(exc)) from exc
        if options["submit_here"]:
            campaign = campaign_submit(campaign_id=campaign.pk)
        self.stdout.write(f"campaign {campaign.pk} ({campaign.task_count} agents) status {campaign.status}"
                          + (f", job {campaign.job_number}" if campaign.job_number else ""))
