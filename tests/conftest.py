"""The kinds of test, and the fixtures more than one kind shares.

A test's kind is the folder it lives in (pytest.ini lists the markers; the marker is set here from
the folder, so ``-m db`` or ``-m "not browser"`` select by kind):

    tests/unit         no database, no service: plain functions on captured output and files
    tests/db           the Django database (SQLite or PostgreSQL), nothing else: no cluster, no Redis
    tests/integration  the real dev cluster (Grid Engine, Redis), as the submit account tco
    tests/browser      Debian's Chromium on the live stack (web server + workers) and the cluster
    tests/host         this host's own facilities: real bubblewrap sandboxes (host/sandbox, as tco),
                       other local accounts (host/accounts, as root)
    tests/faults       the cluster's services stopped and started (scripts/faults, as root)
    tests/deploy       the site layout (nginx, systemd units) on this machine

``make check`` runs unit and db (no cluster, about a minute); ``make test`` runs every kind.
Helpers shared as plain code (factories, the live stack, the browser's sign-in) are in tests/support/.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.support.campaigns import DEMO_PASSWORD, make_campaign
from tests.support.history import PASSWORD
from tests.support.stack import live_store_clear
from tests.support.stack_serving import MAIL_SETTINGS, serving_stack

TESTS = Path(__file__).resolve().parent
# Tests import tco_web.asgi without a server: no start-up loading, heap freeze or broker warm-up there
# (tco_web.asgi.load_for_first_requests, enqueue.warm); the live stacks' web servers set it back to 1.
os.environ.setdefault("TCO_WEB_WARM", "0")
KINDS = ("unit", "db", "integration", "browser", "host", "faults", "deploy")
#: The fixtures that open the database: a unit test asking for one belongs in tests/db.
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
               "bootstrap", "live_server"}
#: Where a database or unit test finds "Redis": nothing listens on the discard port, so a connection is refused at once.
NO_REDIS_URL = "redis://127.0.0.1:9/0"


def pytest_configure(config):
    from tests.support import static_scan

    static_scan.install()


def kind_of(item) -> str | None:
    parts = Path(item.path).resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in KINDS else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a cluster test's fixtures are torn down (its database still there), delete the jobs of
    its campaigns that the cluster still lists (``tests.support.cluster.qdel_leftover_campaign_jobs``):
    a failed or timed-out test must not leave work on the shared cluster (issue 24: a demo's bill
    showed 1156 tasks of other suites' jobs)."""
    if kind_of(item) in ("integration", "browser") and (item.get_closest_marker("django_db")
                                                       or DB_FIXTURES & set(item.fixturenames)):
        try:
            from tests.support.cluster import qdel_leftover_campaign_jobs

            left = qdel_leftover_campaign_jobs()
            if left:
                print(f"\n{item.nodeid}: deleted jobs it left on the cluster: {left}")
        except Exception as exc:  # noqa: BLE001 - the cleanup must not turn a pass into an error
            print(f"\n{item.nodeid}: leftover jobs not checked: {type(exc).__name__}: {exc}")
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each test gets its kind's marker; a unit test that opens the database is an error, and a
    database test that opens none is ``db_independent`` (make test's PostgreSQL pass, ``-m "not
    db_independent"``, leaves out what cannot differ from its SQLite run)."""
    misplaced = []
    for item in items:
        kind = kind_of(item)
        if kind is None:
            continue
        item.add_marker(getattr(pytest.mark, kind))
        opens_db = item.get_closest_marker("django_db") or DB_FIXTURES & set(item.fixturenames)
        if kind == "unit" and opens_db:
            misplaced.append(item.nodeid)
        if kind == "db" and not opens_db:
            # It cannot reach the database (pytest-django refuses): the same on SQLite and PostgreSQL.
            item.add_marker(pytest.mark.db_independent)
    if misplaced:
        raise pytest.UsageError("unit tests use no database; move these to tests/db: " + ", ".join(misplaced))


@pytest.fixture
def memory_live_store(settings, request):
    """The live store in this process's memory, empty, the producer run at each wake-up
    (core.live_bus.MemoryBus): for tests that render pages from a status or rows they write
    themselves, with no poll to mark the change (the shared Redis store may hold another test's
    snapshot of the same view). Unit and database tests always get it."""
    from dashboards.core import live_bus

    settings.TCO_LIVE_BUS = "memory"
    live_bus.MEMORY.reset()
    live_bus.MEMORY.eager = True
    request.addfinalizer(live_bus.MEMORY.reset)
    return live_bus.MEMORY


@pytest.fixture(autouse=True)
def _no_services_for_unit_and_db(request):
    """Unit and database tests reach no service: a private cache (tco's JSON contract kept), an
    in-memory channel layer, "Redis" on a port where nothing listens (the health probe and the queue
    depth history find it down), and worker tasks recorded instead of sent to the broker (the name
    must be one ``worker.tasks`` registers, the arguments JSON). A test that sets its own (a dead
    Redis cache, ``enqueue.send`` patched) overrides these."""
    if kind_of(request.node) not in ("unit", "db"):
        return
    import json

    from dashboards.core import enqueue
    from schedulers.gridengine import adapter as gridengine_adapter

    settings = request.getfixturevalue("settings")
    monkeypatch = request.getfixturevalue("monkeypatch")
    settings.CACHES = {"default": {"BACKEND": "tests.support.cache.JSONLocMemCache",
                                   "LOCATION": f"tco-test-{os.getpid()}-{request.node.nodeid}"}}
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.REDIS_URL = NO_REDIS_URL
    request.getfixturevalue("memory_live_store")

    def send(name, *args, queue=None):
        assert name in enqueue.TASK_NAMES, f"{name} is not a task worker.tasks registers"
        json.dumps(list(args))

    monkeypatch.setattr(enqueue, "send", send)
    monkeypatch.setattr(gridengine_adapter, "run_command", _no_cluster_commands(gridengine_adapter.run_command))


def _no_cluster_commands(run_command):
    """``run_command`` for unit and database tests: a Grid Engine client of the machine (a binary under
    ``/usr``) answers SchedulerUnavailable, as on a machine without a cluster; a test's own stand-in
    binary (a script in its temporary directory, on the PATH it gives) runs. Without it, every launch
    forecast in a database test ran the dev cluster's real ``qstat -g c`` (about 0.2 s each under load)
    and its figures followed whatever the cluster ran at the time (found 2026-12-03, helper check9)."""

    from schedulers.base import SchedulerUnavailable
    from schedulers.gridengine.commands import sge_environment

    def guarded(argv, *args, env_extra=None, **kwargs):
        found = shutil.which(argv[0], path=sge_environment(env_extra).get("PATH")) if argv else None
        if found and os.path.realpath(found).startswith("/usr/"):
            raise SchedulerUnavailable(f"{argv[0]}: unit and database tests reach no cluster")
        return run_command(argv, *args, env_extra=env_extra, **kwargs)

    return guarded


@pytest.fixture(autouse=True)
def _memoized_passwords(settings):
    """Passwords hash through tests/support/hashers.py (PBKDF2 as Django's, memoized) in every test:
    ``bootstrap``'s admin, the role users and each login's check would otherwise cost a real PBKDF2
    each (0.3 s, 1 s on a loaded host). Django checks a password with the last hasher listed under its
    algorithm's name: Django's own PBKDF2 hasher is left out. The live stack's processes check with
    the same hasher (tests/support/stack_settings.py)."""
    from tests.support.hashers import hashers_memoized

    settings.PASSWORD_HASHERS = hashers_memoized(settings.PASSWORD_HASHERS)


@pytest.fixture
def bootstrap(db, tmp_path, settings):
    """Cluster, teams, demo agent and an admin, with a private spool per test."""
    settings.TCO_SPOOL_DIR = tmp_path / "spool"
    settings.STATE_DIR = tmp_path  # the admin-password file of the tests stays out of the real state dir
    os.environ["TCO_ADMIN_PASSWORD"] = "test-admin-pw-1"
    call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
    return settings


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
    """Hash new passwords with MD5 in this process (PBKDF2 costs about 0.3 s a hash here).

    A password hashed before this fixture ran (``role_users`` may come first) is PBKDF2: it is checked
    with tests/support/hashers.py's memoized PBKDF2 (Django checks with the last hasher of an algorithm;
    Django's own cost 0.3-1 s a login). Only for tests without the live stack: its processes accept
    PBKDF2 only.
    """
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher",
                                 "tests.support.hashers.MemoizedPBKDF2PasswordHasher"]


# --- users, teams and campaigns -----------------------------------------------------------------

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


OPS_ROLES = ("viewer", "lead", "launcher", "urgent")


@pytest.fixture
def ops_users(bootstrap, django_user_model):
    """One user per role on research (``<role>``), one launcher of engineering (``other``),
    one signed-in user on no team (``nobody``) and the bootstrap ``admin``.

    Their passwords are unusable (hashing is slow); browser tests use ``ops_logins``."""
    from dashboards.models import Team
    from dashboards.team_models import Role
    from dashboards.core.roles import membership_set

    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    users = {}
    for role in OPS_ROLES:
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


def _now():
    from django.utils import timezone

    return timezone.now()


WORLD_NOW = _now()


@pytest.fixture
def world(role_users, settings, monkeypatch):
    """Campaign "alpha" of research (4 tasks), "beta" of engineering (2), and a job tco did not launch."""
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Task, Team

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # Consumers close "old" connections around each ORM call, which would close the
    # test's own connection mid-transaction (CONN_MAX_AGE is 0 for SQLite).
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    admin = role_users["admin"]
    alpha = make_campaign(team=research, user=admin, name="alpha", job_number=1001, tasks=[
        {"state": "running", "state_code": "r", "host": "vm", "started_at": WORLD_NOW},
        {"state": "pending"},
        {"state": "failed", "exit_status": 3, "failed_code": 0, "ended_at": WORLD_NOW},
        {"state": "done", "exit_status": 0, "failed_code": 0, "ended_at": WORLD_NOW},
    ])
    beta = make_campaign(team=engineering, user=admin, name="beta", job_number=1002,
                         tasks=[{"state": "pending"}, {"state": "pending"}])
    other = Task.objects.create(cluster=cluster_get_default(), job_number=2000, name="someone-elses-job",
                                owner="alice", project="research", state="pending", state_code="qw")
    return {"users": role_users, "alpha": alpha, "beta": beta, "other": other,
            "alpha_task": alpha.tasks.get(task_number=1), "beta_task": beta.tasks.get(task_number=1)}


@pytest.fixture(scope="module")
def runs() -> Path:
    """The demo sweep's eight runs (demo/demo_sweep.py), written once per module under var/."""
    import subprocess
    import sys
    import tempfile

    from tests.support.paths import REPO

    # Outside the host's /tmp: a sandbox policy may list nothing inside it (other tasks' scratch).
    (REPO / "var").mkdir(exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="test-sweep-runs-", dir=REPO / "var"))
    for task in range(1, 9):
        subprocess.run([sys.executable, "-m", "demo.demo_sweep", "--out", str(out), "--task", str(task)],
                       cwd=REPO, capture_output=True, timeout=60)
    yield out
    shutil.rmtree(out, ignore_errors=True)


# --- the live stack: tco's web server (uvicorn) + a Celery worker (poll, ingest, submit with DRMAA) + beat --
# One stack per test module here (tests/browser shares one among its modules: its conftest.py), started
# on the test database before the module's first test; each test still gets a fresh database
# (transactional_db empties it after the test) and tco_bootstrap's data, with the stack's spool as its
# spool. A module whose tests could not share one would say so here.

@pytest.fixture(scope="module")
def live_stack_server(django_db_setup, tmp_path_factory, request):
    """This module's live stack on the test database, with the project's settings (and the tests'
    password hasher: tests/support/stack_settings.py)."""
    with serving_stack(f"stack-{request.module.__name__.rsplit('.', 1)[-1]}", tmp_path_factory) as stack:
        yield stack


@pytest.fixture(scope="module")
def ops_stack_server(django_db_setup, tmp_path_factory, request):
    """This module's live stack with mail written to files under ``var/test-output/mail``
    (tests/support/mail_settings.py) instead of sent."""
    with serving_stack(f"ops-stack-{request.module.__name__.rsplit('.', 1)[-1]}", tmp_path_factory,
                       MAIL_SETTINGS, "ops") as stack:
        yield stack


@pytest.fixture
def live_stack(live_stack_server, transactional_db, bootstrap):
    """The module's live stack, for a test on a fresh database with the bootstrap data (and an empty live store)."""
    live_store_clear()
    bootstrap.TCO_SPOOL_DIR = live_stack_server.spool
    return live_stack_server


@pytest.fixture
def ops_stack(ops_stack_server, transactional_db, bootstrap):
    """The module's live stack with mail to files, for a test on a fresh database with the bootstrap data."""
    live_store_clear()
    bootstrap.TCO_SPOOL_DIR = ops_stack_server.spool
    return ops_stack_server
