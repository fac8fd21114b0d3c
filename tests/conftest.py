"""Shared fixtures: bootstrap data, and the real stack (web server and workers) as subprocesses."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

REPO = Path(__file__).resolve().parent.parent
TEST_OUTPUT = Path(settings.STATE_DIR) / "test-output"


@pytest.fixture
def bootstrap(db, tmp_path, settings):
    """Cluster, teams, demo agent and an admin, with a private spool per test."""
    settings.TCO_SPOOL_DIR = tmp_path / "spool"
    settings.STATE_DIR = tmp_path  # the admin-password file of the tests stays out of the real state dir
    os.environ["TCO_ADMIN_PASSWORD"] = "test-admin-pw-1"
    call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
    return settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url(name: str) -> str:
    """A ``DATABASE_URL`` (dj-database-url's format) for database ``name`` on the server under test.

    SQLite: ``name`` is the file. PostgreSQL: ``name`` is the database (the
    pytest-django test database), on the same server with the same role.
    """
    from urllib.parse import quote

    from django.db import connection

    conf = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    if connection.vendor == "postgresql":
        auth = quote(conf["USER"] or "", safe="")
        if conf["PASSWORD"]:
            auth += ":" + quote(conf["PASSWORD"], safe="")
        return f"postgres://{auth}@{conf['HOST'] or ''}:{conf['PORT'] or 5432}/{quote(name, safe='')}"
    raise RuntimeError(f"no DATABASE_URL form for the {connection.vendor} backend")


class Stack:
    """tco's web server and workers, started against the test database (SQLite file or PostgreSQL database)."""

    def __init__(self, db_path: str, spool: Path, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = {
            **os.environ,
            "DATABASE_URL": test_database_url(db_path),
            "TCO_SPOOL_DIR": str(spool),
            "PYTHONDONTWRITEBYTECODE": "1",
            "DJANGO_SETTINGS_MODULE": "tco_web.settings",
        }
        self.env.pop("DATABASE_URL_FILE", None)  # it would win over DATABASE_URL (settings.env_str)
        self.log_dir = log_dir

    def start(self, name: str, argv: list[str], *, pass_fds: tuple[int, ...] = (), **extra_env: str) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, cwd=REPO, env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=pass_fds)
        self.procs.append((name, proc))

    def wait_http(self, timeout: float = 30.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"web server did not answer on {self.url}; see {self.log_dir}/web.log")

    def start_services(self, beat_schedule: Path, worker_name: str) -> None:
        """Purge the test broker, then start the web server (uvicorn), the live views' producer, a Celery worker
        (poll, ingest, submit with DRMAA) and beat."""
        py = sys.executable
        # Tasks left in the test broker by an aborted run must not reach this database.
        subprocess.run([py, "-m", "celery", "-A", "tco_web", "purge", "-f"], cwd=REPO, env=self.env,
                       check=True, capture_output=True, timeout=60)
        # As scripts/services and the site's tco-web.service: uvicorn, TCO_WEB_WORKERS processes (default 2).
        self.start("web", [py, "-m", "uvicorn", "tco_web.asgi:application", "--host", "127.0.0.1",
                           "--port", str(self.port), "--workers", os.environ.get("TCO_WEB_WORKERS", "2"),
                           "--lifespan", "off", "--no-server-header", "--timeout-graceful-shutdown", "5",
                           "--no-proxy-headers", "--ws-per-message-deflate", "false"])
        # The live views' producer (docs/live.md), as scripts/services starts it.
        self.start("live", [py, "manage.py", "tco_live_publish"])
        self.start("worker", [py, "-m", "celery", "-A", "tco_web", "worker", "-Q", "poll,ingest,submit", "-c", "2",
                              "-n", f"{worker_name}{self.port}@%h", "--loglevel=INFO"], TCO_DRMAA_WORKER="1")
        self.start("beat", [py, "-m", "celery", "-A", "tco_web", "beat", "--loglevel=INFO",
                            "--schedule", str(beat_schedule)])

    @contextmanager
    def serving(self, beat_schedule: Path, worker_name: str) -> Iterator["Stack"]:
        """:meth:`start_services`, wait for the web server (RuntimeError after 30 s), yield the stack,
        and :meth:`stop` it however the block ends."""
        self.start_services(beat_schedule, worker_name)
        try:
            self.wait_http()
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            proc.terminate()
        for _, proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def live_stack(transactional_db, bootstrap, tmp_path):
    """The web server (uvicorn) + the live producer + a Celery worker (poll, ingest, submit with DRMAA) + beat,
    on the test database."""
    from django.db import connection

    db_path = connection.settings_dict["NAME"]
    log_dir = TEST_OUTPUT / "stack-logs"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    stack = Stack(db_path, Path(bootstrap.TCO_SPOOL_DIR), log_dir)
    with stack.serving(tmp_path / "beat-schedule", "test"):
        yield stack


# --- roles and scoped data (issue 6) ----------------------------------------------------

DEMO_PASSWORD = "test-demo-pw-1"


@pytest.fixture
def locmem_cache(settings):
    """A private in-process cache: ids are reused between tests, so a shared cache would leak."""
    from django.core.cache import caches

    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"tco-test-{os.getpid()}"}}
    caches["default"].clear()
    yield
    caches["default"].clear()


@pytest.fixture
def fast_passwords(settings):
    """Hash new passwords with MD5 in this process (PBKDF2 costs about 0.25 s a hash here).

    Only for tests without the live stack: its processes accept PBKDF2 only.
    """
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher",
                                 "django.contrib.auth.hashers.PBKDF2PasswordHasher"]


@pytest.fixture
def role_users(bootstrap):
    """The admin plus one demo user per role (dashboards.core.accounts.DEMO_USERS), password DEMO_PASSWORD."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import get_hasher

    from dashboards.core.accounts import demo_users_ensure

    users = demo_users_ensure(password=DEMO_PASSWORD)
    admin = get_user_model().objects.get(username="admin")
    if get_hasher().algorithm == "md5":  # fast_passwords: re-hash the admin's too
        admin.set_password(os.environ["TCO_ADMIN_PASSWORD"])
        admin.save()
    users["admin"] = admin
    return users


def make_campaign(*, team, user, name: str, tasks: list[dict] | None = None, job_number: int = 1000,
                  status: str = "submitted", launched_at=None, **fields):
    """A campaign and its tasks written straight to the database (no scheduler).

    ``tasks``: one dict of Task field values per task (task_number defaults to
    its position, 1-based; state to pending).
    """
    import datetime as dt

    from django.utils import timezone

    from dashboards.models import AgentDefinition, Campaign, Task
    from dashboards.core.clusters import cluster_get_default

    cluster = cluster_get_default()
    launched_at = launched_at or timezone.now() - dt.timedelta(minutes=5)
    tasks = tasks if tasks is not None else [{}]
    campaign = Campaign.objects.create(
        name=name, cluster=cluster, team=team, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        launched_by=user, queue="agent.q", task_count=len(tasks), status=status, launched_at=launched_at,
        submitted_at=launched_at + dt.timedelta(seconds=0.25), job_number=job_number, **fields)
    rows = []
    for n, values in enumerate(tasks, 1):
        values = {"task_number": n, "state": "pending", "state_code": "qw", "submitted_at": launched_at, **values}
        values.setdefault("active", values["state"] not in ("done", "failed", "deleted", "lost"))
        rows.append(Task(cluster=cluster, campaign=campaign, job_number=job_number, is_array=True,
                         name=f"tco-c{campaign.pk}-{name}", owner="tco", project=team.project, **values))
    Task.objects.bulk_create(rows)
    return campaign
