"""tco's web server and workers as subprocesses on the test database (the live stack of the browser,
integration and fault tests), and what they need: a free port, the database's URL, the output directory."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from tests.support.paths import REPO

TEST_OUTPUT = Path(settings.STATE_DIR) / "test-output"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url_for(name: str) -> str:
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


def live_store_clear() -> None:
    """Forget the live views' store (``core.live_bus``: every ``tco:live:`` key of the test Redis): a test on a
    fresh database must not be served snapshots of a former test's rows under the same ids. The producer
    then starts a new epoch and the web processes take its records as newer than what they hold."""
    from dashboards.core import live_bus
    from dashboards.core.redis_client import shared_redis_client

    r = shared_redis_client(timeout_s=5.0)
    keys = list(r.scan_iter(match=live_bus.PREFIX + "*", count=1000))
    if keys:
        r.delete(*keys)


class Stack:
    """tco's web server and workers, started against the test database (SQLite file or PostgreSQL database)."""

    def __init__(self, db_path: str, spool: Path, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url_for(db_path),
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
                           "--no-proxy-headers", "--ws-per-message-deflate", "false"], TCO_WEB_WARM="1")
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
