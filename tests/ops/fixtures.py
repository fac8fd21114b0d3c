"""Fixtures and helpers for the bills/launch/triage tests (issue 7).

Import the fixtures into a test module (``from tests.ops.fixtures import *``).
"""
from __future__ import annotations

import datetime as dt
import itertools
import re
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from dashboards.models import AccountingRecord, AgentDefinition, Campaign, Cluster, Role, Task, Team
from dashboards.core.roles import membership_set
from django.conf import settings
from tests.helpers import wait_until  # noqa: F401  (imported from here by the ops tests)
from tests.sge_env import sge_env

PASSWORD = "ops-test-pw-1"
ROLES = ("viewer", "lead", "launcher", "urgent")
_job_numbers = itertools.count(900_000)


@pytest.fixture
def ops_users(bootstrap, django_user_model):
    """One user per role on research (``<role>``), one launcher of engineering (``other``),
    one signed-in user on no team (``nobody``) and the bootstrap ``admin``.

    Their passwords are unusable (hashing is slow); browser tests use ``ops_logins``."""
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    users = {}
    for role in ROLES:
        user = django_user_model.objects.create_user(role, email=f"{role}@example.org", password=None)
        membership_set(user=user, team=research, role=role)
        users[role] = user
    other = django_user_model.objects.create_user("other", email="other@example.org", password=None)
    membership_set(user=other, team=engineering, role=Role.LAUNCHER)
    users["other"] = other
    users["nobody"] = django_user_model.objects.create_user("nobody", password=None)
    users["admin"] = django_user_model.objects.get(username="admin")
    return users


@pytest.fixture
def ops_logins(ops_users):
    """``ops_users`` with the password ``PASSWORD`` (the admin keeps the bootstrap one)."""
    for name, user in ops_users.items():
        if name != "admin":
            user.set_password(PASSWORD)
            user.save(update_fields=["password"])
    return ops_users


def make_campaign(*, team: Team, user, name: str = "hist", status: str = "finished", count: int = 0,
                  model: str = "", agent: AgentDefinition | None = None, job_number: int | None = None) -> Campaign:
    from django.utils import timezone

    from dashboards.core.clusters import cluster_get_default

    return Campaign.objects.create(
        name=name, cluster=cluster_get_default(), team=team,
        agent_definition=agent or AgentDefinition.objects.get(name="demo-agent"), launched_by=user,
        queue="agent.q", task_count=count, status=status, launched_at=timezone.now(), model=model,
        job_number=job_number if job_number is not None else next(_job_numbers))


def make_task(campaign: Campaign | None, *, task_number: int = 1, started_at: dt.datetime | None,
              wallclock_s: float = 0.0, slots: int = 1, state: str = "done", tokens: dict | None = None,
              cost_usd: Decimal | str | None = None, project: str | None = None, job_number: int | None = None,
              cluster: Cluster | None = None, account: bool = True) -> Task:
    """A finished task with its accounting record (started at ``started_at``), tokens and cost."""
    from dashboards.core.clusters import cluster_get_default

    cluster = cluster or (campaign.cluster if campaign else cluster_get_default())
    job = job_number or (campaign.job_number if campaign else next(_job_numbers))
    project = project or (campaign.team.project if campaign else "research")
    ended = started_at + dt.timedelta(seconds=wallclock_s) if started_at else None
    submitted = (started_at or dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)) - dt.timedelta(seconds=5)
    task = Task.objects.create(
        cluster=cluster, campaign=campaign, job_number=job, task_number=task_number, is_array=True,
        project=project, state=state, active=state not in ("done", "failed", "deleted", "lost"),
        submitted_at=submitted, started_at=started_at, ended_at=ended, wallclock_s=wallclock_s, slots=slots,
        cost_usd=Decimal(str(cost_usd)) if cost_usd is not None else None, **(tokens or {}))
    if account and started_at is not None:
        def us(value: dt.datetime) -> int:
            return int(value.timestamp()) * 1_000_000

        AccountingRecord.objects.create(
            cluster=cluster, task=task, job_number=job, task_number=task_number, submission_us=us(submitted),
            start_us=us(started_at), end_us=us(ended), submitted_at=submitted, started_at=started_at,
            ended_at=ended, job_name="x", owner="tco", group="tco", project=project, queue="agent.q",
            hostname="vm", slots=slots, wallclock_s=wallclock_s, cpu_s=0.0, maxvmem_bytes=0.0, failed=0,
            exit_status=0)
    return task


@pytest.fixture
def ops_stack(transactional_db, bootstrap, tmp_path):
    """The live stack (daphne, a Celery worker with DRMAA, beat) with the ops pages included
    (``tests.ops.settings``) and mail written to ``var/test-output/mail``."""
    from django.db import connection

    from tests.conftest import TEST_OUTPUT, Stack

    db_path = connection.settings_dict["NAME"]
    log_dir = TEST_OUTPUT / "ops-stack-logs"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    mail_dir = TEST_OUTPUT / "mail"
    mail_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(db_path, Path(bootstrap.TCO_SPOOL_DIR), log_dir)
    stack.env["DJANGO_SETTINGS_MODULE"] = "tests.ops.settings"
    stack.mail_dir = mail_dir
    with stack.serving(tmp_path / "beat-schedule", "ops"):
        yield stack


# --------------------------------------------------------------------------- the real cluster

SGE_ENV = sge_env(settings.SGE_ROOT, settings.SGE_CELL, LC_ALL="C")


def qstat_jobs() -> dict[int, dict[str, str]]:
    """job number -> {"name", "owner", "state", "project"} from ``qstat -xml -u '*' -ext``, read here with regexes."""
    out = subprocess.run(["qstat", "-xml", "-u", "*", "-ext"], capture_output=True, text=True, check=True,
                         env={**SGE_ENV, "TZ": "UTC"}).stdout
    jobs: dict[int, dict[str, str]] = {}
    for block in re.findall(r"<job_list[^>]*>(.*?)</job_list>", out, re.S):
        fields = dict(re.findall(r"<(JB_job_number|JB_name|JB_owner|state|JB_project)>([^<]*)<", block))
        number = int(fields["JB_job_number"])
        jobs.setdefault(number, {"name": fields.get("JB_name", ""), "owner": fields.get("JB_owner", ""),
                                 "project": fields.get("JB_project", ""), "states": ""})
        jobs[number]["states"] += fields.get("state", "") + " "
    return jobs



def job_gone_or_deleting(job: int) -> bool:
    """Whether qstat no longer lists ``job`` or shows it deleting; one qstat per call,
    since the job may leave between two."""
    jobs = qstat_jobs()
    return job not in jobs or "d" in jobs[job]["states"]

def qdel_quietly(*job_numbers: int | None) -> None:
    """Delete our own jobs by number (never by user: other suites share the cluster)."""
    ids = [str(j) for j in job_numbers if j]
    if ids:
        subprocess.run(["qdel", *ids], capture_output=True, env=SGE_ENV)




def timing(*, cluster, team, count, queue="agent.q", seats_per_task=1, concurrency_cap=None, priority=0,
           duration_s=None, now=None, agent_definition=None, predecessor_job=None, user=None, scheduler=None):
    """``launch.forecast.timing_forecast`` for a campaign of ``count`` tasks with these launch fields."""
    from dashboards.launch.forecast import timing_forecast
    from dashboards.launch.service import LaunchRequest

    request = LaunchRequest(team=team, agent_definition=agent_definition, inputs=[{}] * count, name="forecast",
                            queue=queue, seats_per_task=seats_per_task, concurrency_cap=concurrency_cap,
                            priority=priority, predecessor_job=predecessor_job)
    return timing_forecast(request, cluster=cluster, duration_s=duration_s, user=user, now=now, scheduler=scheduler)
