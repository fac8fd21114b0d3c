"""A web process that launches one campaign through the launch page and is killed mid-launch.

    python -m tests.faults.web_child --point P --sent FILE --name NAME --user USER

Runs the whole web path of a launch (Django's request handler, the launch view, its form and the
launch service) with Django's test client in this process, on the database of ``DATABASE_URL``,
signed in as USER, and kills itself with SIGKILL at point P:

- ``before-commit``: inside the launch's transaction, after the campaign's spool files are written;
- ``after-commit``: after the commit, before the submission message is sent;
- ``after-send``: after the submission message is sent (appended to FILE as a JSON line, where
  the broker would have it), before the page answers.

Without ``--point`` it answers normally and prints the response's status. Never returns at a point.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--point", choices=("before-commit", "after-commit", "after-send"))
    parser.add_argument("--sent", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--user", default="launcher")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from dashboards.core import enqueue
    from dashboards.launch import spool as launch_spool
    from tests.support.forms import launch_data

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]

    def die() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def send(name, *task_args, **kw):
        if args.point == "after-commit":
            die()
        with open(args.sent, "a", encoding="utf-8") as f:
            f.write(json.dumps({"task": name, "args": list(task_args)}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if args.point == "after-send":
            die()

    enqueue.send = send
    if args.point == "before-commit":
        write = launch_spool.campaign_spool_write

        def write_then_die(*a, **kw):
            write(*a, **kw)
            die()

        launch_spool.campaign_spool_write = write_then_die
    client = Client()
    client.force_login(get_user_model().objects.get(username=args.user))
    response = client.post("/ops/launch/", {**launch_data(name=args.name, input_params="task=1..2 duration_s=1",
                                                          seats_per_task="1"), "launch": "1"})
    print(f"status {response.status_code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
