"""make demo's users have e-mail addresses and its mail goes to files (issue 24, the users' day): the
demo's leads had none, so a budget alert on the budgets page read "e-mail failed: no recipients"."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.billing import budgets
from dashboards.core.accounts import DEMO_USERS, demo_users_ensure
from dashboards.models import Team
from tests.support.history import make_campaign, make_task
from tests.support.paths import REPO

pytestmark = pytest.mark.django_db


def test_the_demo_leads_get_a_budget_alert_by_e_mail(bootstrap, client, mailoutbox,
                                                    django_capture_on_commit_callbacks):
    users = demo_users_ensure(password="x-demo-password-1")
    assert {name: u.email for name, u in users.items()} == {name: f"{name}@example.org" for name in DEMO_USERS}
    # An address a user already has is kept, and a second run changes nothing.
    users["viewer"].__class__.objects.filter(pk=users["viewer"].pk).update(email="me@research.test")
    assert demo_users_ensure(password="x-demo-password-1")["viewer"].email == "me@research.test"
    research = Team.objects.get(project="research")
    spent = make_campaign(team=research, user=users["launcher"])
    make_task(spent, started_at=timezone.now() - dt.timedelta(minutes=5), cost_usd="60")
    budgets.budget_set(user=users["lead"], team=research, period="month", amount_usd=Decimal("100"),
                       thresholds=[0.5], on_exceed="refuse", alert_emails=[])
    with django_capture_on_commit_callbacks(execute=True):
        assert len(budgets.budget_check_alerts(teams=[research])) == 1
    assert [m.to for m in mailoutbox] == [["lead@example.org"]]  # research's one lead
    client.force_login(users["lead"])
    html = client.get("/ops/budgets/").content.decode()
    assert 'data-sent="yes"' in html and "e-mail failed" not in html


def _mail_settings(module: str = "settings", **env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EMAIL_", "TCO_PRODUCTION", "DEBUG"))}
    done = subprocess.run([sys.executable, "-c", f"from tco_web import {module} as s; "
                           "print(s.EMAIL_BACKEND); print(s.EMAIL_FILE_PATH)"],
                          cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.db_independent
def test_without_production_mail_is_written_to_files_in_the_state_directory(tmp_path):
    assert _mail_settings(TCO_STATE_DIR=str(tmp_path)) == ["django.core.mail.backends.filebased.EmailBackend",
                                                           str(tmp_path / "mail")]
    production = _mail_settings(TCO_STATE_DIR=str(tmp_path), TCO_PRODUCTION="1", ALLOWED_HOSTS="tco.example.org")
    assert production[0] == "django.core.mail.backends.smtp.EmailBackend"
    assert _mail_settings(EMAIL_BACKEND="x.Backend")[0] == "x.Backend"


@pytest.mark.db_independent
def test_a_site_on_the_deploy_settings_sends_mail_by_smtp(tmp_path):
    """deploy/tco.env.example runs a site on tco_web.deploy_settings and sets no TCO_PRODUCTION (the
    deploy settings make it secure themselves): its budget alerts and campaign notices must go out by
    SMTP, not into files under <state dir>/mail while the budgets page says 'e-mailed'."""
    assert _mail_settings("deploy_settings", TCO_STATE_DIR=str(tmp_path))[0] == \
        "django.core.mail.backends.smtp.EmailBackend"
    assert _mail_settings("deploy_settings", TCO_STATE_DIR=str(tmp_path), EMAIL_BACKEND="x.Backend")[0] == "x.Backend"


def test_the_demo_password_comes_from_a_file_never_a_command_line(bootstrap, tmp_path):
    """Fresh attack (2026-12-03): scripts/demo ran ``tco_demo_users --password "$(cat admin-password)"``
    and another local account read the admin's password in /proc/PID/cmdline. The command reads a file;
    no script of the project hands a secret's content to an option (scripts/, Makefile)."""
    import re

    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command

    secret = tmp_path / "pw"
    secret.write_text("x-file-demo-password-2\n")
    call_command("tco_demo_users", password_file=str(secret), stdout=open(os.devnull, "w"))
    assert all(get_user_model().objects.get(username=name).check_password("x-file-demo-password-2")
               for name in DEMO_USERS)
    empty = tmp_path / "empty"
    empty.write_text("")
    for bad, words in ((empty, "is empty"), (tmp_path / "missing", "cannot read")):
        with pytest.raises(CommandError, match=words):
            call_command("tco_demo_users", password_file=str(bad))
    on_a_command_line = re.compile(r"--[\w-]*(password|token|secret)[\w-]*[ =]\"?\$\(")
    found = [f"{path.relative_to(REPO)}:{n}" for path in [*(REPO / "scripts").iterdir(), REPO / "Makefile"]
             if path.is_file() for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if on_a_command_line.search(line)]
    assert found == []
