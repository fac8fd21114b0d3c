"""The dev cluster's services as the fault tests stop and start them: the qmaster (its own admin
command), Redis, an accounting ingest in a process of its own, jobs submitted as the submit account,
one round of what the workers do, and waiting for a condition."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]


def sge_env() -> dict:
    """The environment for Grid Engine commands (UTC, the dev cell)."""
    return {"SGE_ROOT": settings.SGE_ROOT, "SGE_CELL": settings.SGE_CELL, "TZ": "UTC",
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def qstat_answers() -> bool:
    return subprocess.run(["qstat", "-u", "*", "-xml"], env=sge_env(), capture_output=True,
                          timeout=30).returncode == 0


def wait_for(what: str, predicate, timeout: float, step: float = 0.5):
    """Call ``predicate`` until it returns a true value (returned) or ``timeout`` seconds pass (fails)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def submit_as_tco(*args: str) -> int:
    """``qsub -terse`` as the submit account; returns the job number (``1234`` of ``1234.1-6:1``)."""
    user = os.environ.get("TCO_USER", "tco")
    argv = ["qsub", "-terse", *args]
    if os.getuid() == 0:
        argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in sge_env().items()), *argv]
    out = subprocess.run(argv, env=sge_env(), capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(".")[0])


def child_env(db_name: str) -> dict:
    """Environment for a tco process (the ingest child, workers) on the test database ``db_name``."""
    return {**os.environ, "DATABASE_URL": f"sqlite:///{db_name}", "DJANGO_SETTINGS_MODULE": "tco_web.settings",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}


def run_child(args: list[str], db_name: str, **kw) -> subprocess.Popen:
    """Start ``python -m tests.faults.ingest_child ARGS`` on the test database."""
    return subprocess.Popen([sys.executable, "-m", "tests.faults.ingest_child", *args], cwd=REPO,
                            env=child_env(db_name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def qmaster_stop() -> None:
    """Shut the qmaster down with its own admin command (``qconf -km``, root is a manager)."""
    subprocess.run(["qconf", "-km"], env=sge_env(), capture_output=True, timeout=60)
    wait_for("the qmaster to stop answering", lambda: not qstat_answers(), 90, step=1)


def qmaster_start() -> None:
    """Start ``sge_qmaster`` as scripts/dev-cluster does, unless it answers already; wait until it does."""
    if qstat_answers():
        return
    spool = "/var/spool/gridengine/qmaster"
    for stale in ("qmaster.pid", "lock"):
        try:
            os.unlink(os.path.join(spool, stale))  # left behind only by a qmaster that died
        except FileNotFoundError:
            pass
    subprocess.run(["/usr/sbin/sge_qmaster"], env=sge_env(), capture_output=True, timeout=60, check=True)
    wait_for("the qmaster to answer again", qstat_answers, 120, step=1)


def poll_cycle(cluster) -> bool:
    """One round of the periodic worker tasks, as worker/tasks.py runs them: poll (a failure is
    recorded, never applied), accounting ingest, runner records, reconcile. Returns whether the poll worked."""
    from django.utils import timezone

    from dashboards.ingest.poll import apply_qstat_poll, reconcile_gone_tasks, record_poll_failure
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.ingest.runner_records import ingest_runner_records
    from dashboards.core.clusters import scheduler_for
    from schedulers.base import SchedulerError

    observed = timezone.now()
    try:
        tasks = scheduler_for(cluster).list_tasks()
    except SchedulerError as exc:
        record_poll_failure(cluster, f"{type(exc).__name__}: {exc}")
        ok = False
    else:
        apply_qstat_poll(cluster, tasks, observed_at=observed)
        ok = True
    from dashboards.ingest.orphans import recover_killed_runners

    ingest_accounting(cluster)
    ingest_runner_records(cluster)
    reconcile_gone_tasks(cluster)
    recover_killed_runners(cluster)
    return ok


class RedisServer:
    """The Redis server behind ``settings.REDIS_URL``, stopped and started with its own commands.

    What is needed to start it again exactly as it ran (executable, config
    file, bind address, port, pid file, data folder, its user) is read from
    the running server (``INFO server``, ``CONFIG GET``) before it is stopped.
    """

    def __init__(self, url: str) -> None:
        import pwd

        import redis

        self.url = url
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        info = client.info("server")
        config = client.config_get("*")
        client.close()
        self.pid = int(info["process_id"])
        with open(f"/proc/{self.pid}/status") as fh:
            uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
        self.user = pwd.getpwuid(uid).pw_name
        # INFO's "executable" joins a relative argv[0] to the cwd, and the binary behaves by its argv[0]
        # name (redis-server is a link to redis-check-rdb): that name, in the folder of the real binary.
        executable = info["executable"]
        if not os.path.exists(executable):
            executable = shutil.which(os.path.basename(executable)) or executable
        self.argv = [executable]
        if info.get("config_file"):
            self.argv.append(info["config_file"])
        self.argv += ["--bind", config.get("bind") or "127.0.0.1", "--port", str(config["port"]),
                      "--daemonize", "yes", "--supervised", "no", "--dir", config["dir"]]
        if config.get("pidfile"):
            self.argv += ["--pidfile", config["pidfile"]]

    def answers(self) -> bool:
        import redis

        try:
            client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (redis.RedisError, OSError):
            return False

    def stop(self) -> None:
        """``SHUTDOWN`` (it saves first when persistence is configured, as a service stop does)."""
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=30)
        try:
            client.shutdown()
        except redis.ConnectionError:
            pass
        wait_for("Redis to stop", lambda: not self.answers(), 30, step=0.2)

    def start(self) -> None:
        if self.answers():
            return
        subprocess.run(["runuser", "-u", self.user, "--", *self.argv], capture_output=True, timeout=30, check=True,
                       cwd="/")
        wait_for("Redis to answer again", self.answers, 30, step=0.2)
