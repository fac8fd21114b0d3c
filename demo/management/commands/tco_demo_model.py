"""Start the scripted stand-in model (not a real model) on the registered demo endpoint's port.

    scripts/listen-as --user tco --address HOST --port PORT --fd 3 -- manage.py tco_demo_model --model-fd 3

``make demo`` runs it before it launches any campaign: research's demo agents and engineering's
review agents call it through the metering proxy (demo/stand_in.py).
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from dashboards.models import ModelEndpoint
from demo.stand_in import StandInError, stand_in_start


class Command(BaseCommand):
    help = "Start the scripted stand-in model on the endpoint's (loopback or bridge) port."

    def add_arguments(self, parser):
        parser.add_argument("--endpoint", default="demo-stand-in",
                            help="name of the registered model endpoint to serve")
        parser.add_argument("--model-fd", type=int, default=None, metavar="FD",
                            help="serve on this inherited listening socket, bound to the endpoint's address and "
                                 "privileged port by root (scripts/listen-as, as scripts/demo does), so that no "
                                 "other local account can take the port over")

    def handle(self, *args, **options):
        endpoint = ModelEndpoint.objects.filter(name=options["endpoint"], active=True).first()
        if endpoint is None:
            raise CommandError(f"model endpoint {options['endpoint']!r} is not registered (run manage.py "
                               "tco_bootstrap, or register it in the admin)")
        try:
            url, pid = stand_in_start(endpoint=endpoint, listen_fd=options["model_fd"], warn=self.stderr.write)
        except StandInError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"stand-in model (scripted, not a real model): {url}, pid {pid}")
