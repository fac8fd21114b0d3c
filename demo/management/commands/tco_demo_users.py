"""Create one demo login per role (viewer, team lead, launcher, urgent launcher on research; a viewer and a
team lead on engineering).

The password comes from ``--password-file`` (a file's first line), ``--password`` or
``TCO_DEMO_PASSWORD``; without any, a random one is generated and printed. ``--password`` is on the
command line, where every local account reads it (``/proc/PID/cmdline``): scripts pass a file
(scripts/demo did not, and a local account captured the admin's password: fresh attack, 2026-12-03).
Run ``tco_bootstrap`` first (it creates the teams and the admin). Raises CommandError for a
password file that cannot be read or is empty.
"""
from __future__ import annotations

import os
import secrets

from django.core.management.base import BaseCommand, CommandError

from dashboards.core.accounts import DEMO_USERS, demo_users_ensure
from dashboards.models import Team


class Command(BaseCommand):
    help = "Create demo users, one per role (see dashboards.core.accounts.DEMO_USERS)."

    def add_arguments(self, parser):
        parser.add_argument("--password-file", help="read the password for every demo user from this file's first "
                                                    "line (never on a command line)")
        parser.add_argument("--password", help="password for every demo user (default: TCO_DEMO_PASSWORD or random); "
                                               "any local account can read a command line: prefer --password-file")
        parser.add_argument("--keep-passwords", action="store_true",
                            help="do not change the password of users that already exist")

    def handle(self, *args, **options):
        if options["password_file"]:
            try:
                with open(options["password_file"], encoding="utf-8") as fh:
                    options["password"] = fh.readline().strip()
            except OSError as exc:
                raise CommandError(f"cannot read the password file {options['password_file']}: {exc.strerror}") from None
            if not options["password"]:
                raise CommandError(f"the password file {options['password_file']} is empty")
        password = options["password"] or os.environ.get("TCO_DEMO_PASSWORD") or secrets.token_urlsafe(12)
        try:
            demo_users_ensure(password=password, reset_password=not options["keep_passwords"])
        except Team.DoesNotExist:
            raise CommandError("the teams do not exist yet: run manage.py tco_bootstrap first") from None
        for username, (project, role) in DEMO_USERS.items():
            self.stdout.write(f"{username}: {role} on {project}")
        if not (options["password"] or os.environ.get("TCO_DEMO_PASSWORD")):
            self.stdout.write(f"password: {password}")
