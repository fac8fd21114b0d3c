"""WebSocket delivery latency from a scheduler change to the browser (goal: p95 <= 2 s).

    runuser -u tco -- env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \\
        .venv/bin/python bench/bench_ws_latency.py [--samples 30] [--db var/bench-ws.sqlite3]

Run as the submit account with the dev cluster and Redis up (``TCO_REDIS_DB`` or ``REDIS_URL``
picks the Redis database; the broker queue is purged first). It starts tco's
web server (daphne), a Celery worker and beat on a database of its own,
submits one job that can never start (it asks for more model API seats than
the cluster has; submitted on hold), opens the live queue page's WebSocket as an admin, and then, again
and again, releases or holds the job with ``qrls``/``qhold``. For each change
it measures, from the moment the command returned:

- **database**: until the poller has written the new state (a thread reads the
  database every 20 ms) -- the baseline: what any page could show at best;
- **WebSocket**: until a pushed queue snapshot shows the new state.

The difference is the push path (channel layer, consumer, scoped re-read).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _django import isolate_state  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def setup_django(db: Path) -> None:
    """Point Django (and the processes started from this environment) at ``db`` and at a state
    directory of its own beside it (``<db>.state``): never the live instance's ``var/``."""
    isolate_state(Path(str(db) + ".state"))
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
    os.environ.setdefault("TCO_ADMIN_PASSWORD", "bench-admin-pw")
    import django

    django.setup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--db", default=str(REPO / "var" / "bench-ws.sqlite3"))
    args = parser.parse_args()
    if os.getuid() == 0:
        sys.exit("run as the submit account (runuser -u tco -- ...): Grid Engine refuses root")

    db = Path(args.db)
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    setup_django(db)
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command

    from dashboards.models import Task

    call_command("migrate", verbosity=0)
    call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
    admin = get_user_model().objects.get(username="admin")
    session = SessionStore()
    session[SESSION_KEY] = str(admin.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = admin.get_session_auth_hash()
    session.create()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_dir = REPO / "var" / "bench-ws-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    py = sys.executable
    subprocess.run([py, "-m", "celery", "-A", "tco_web", "purge", "-f"], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=60)
    procs = []
    for name, argv in (
        ("web", [py, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tco_web.asgi:application"]),
        ("worker", [py, "-m", "celery", "-A", "tco_web", "worker", "-Q", "poll,ingest,submit", "-c", "2",
                    "-n", f"wsbench{port}@%h", "--loglevel=WARNING"]),
        ("beat", [py, "-m", "celery", "-A", "tco_web", "beat", "--loglevel=WARNING",
                  "--schedule", str(log_dir / "beat-schedule")]),
    ):
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=open(log_dir / f"{name}.log", "wb"),
                                      stderr=subprocess.STDOUT))
    sge = {**env, "SGE_ROOT": settings.SGE_ROOT, "SGE_CELL": settings.SGE_CELL}
    job = None
    try:
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"web server did not start; see {log_dir}/web.log") from None
                time.sleep(0.2)
        out = subprocess.run(["qsub", "-terse", "-h", "-b", "y", "-N", "wsbench", "-q", "classic.q",
                              "-l", "anthropic_api=100000", "/bin/sleep", "60"],
                             env=sge, capture_output=True, text=True, check=True).stdout
        job = int(out.strip().split(".")[0])
        print(f"job {job} submitted on hold (it can never start); web server on {base}")
        return asyncio.run(measure(base, session.session_key, job, args.samples, sge, Task))
    finally:
        if job is not None:
            subprocess.run(["qdel", str(job)], env=sge, capture_output=True)
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


async def measure(base: str, session_key: str, job: int, samples: int, sge: dict, Task) -> int:
    import aiohttp

    latest: dict = {"state": None, "at": 0.0}
    changed = asyncio.Event()
    db_seen: dict = {"state": None, "at": 0.0}
    stop = threading.Event()

    def watch_db() -> None:
        from django.db import connection

        while not stop.is_set():
            state = Task.objects.filter(job_number=job, active=True).values_list("state", flat=True).first()
            if state != db_seen["state"]:
                db_seen.update(state=state, at=time.monotonic())
            connection.close()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_db, daemon=True)
    watcher.start()
    headers = {"Cookie": f"sessionid={session_key}", "Origin": base}
    ws_lat: list[float] = []
    db_lat: list[float] = []
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(base.replace("http", "ws") + "/ws/queue/", headers=headers) as ws:

            async def read() -> None:
                async for msg in ws:
                    data = json.loads(msg.data)
                    if data.get("kind") != "queue.snapshot":
                        continue
                    for row in data["data"].get("other_job_rows") or []:
                        if row["job_number"] == job:
                            state = next((s for s, n in row["states"].items() if n), None)
                            if state != latest["state"]:
                                latest.update(state=state, at=time.monotonic())
                                changed.set()

            reader = asyncio.ensure_future(read())
            deadline = time.monotonic() + 30
            while latest["state"] != "held":
                if time.monotonic() > deadline:
                    raise RuntimeError("the held job never showed up on the queue page")
                await asyncio.sleep(0.1)
            print(f"{'#':>3} {'change':<8} {'database s':>10} {'WebSocket s':>12}")
            for i in range(samples):
                target, command = ("pending", "qrls") if latest["state"] == "held" else ("held", "qhold")
                await asyncio.sleep(random.uniform(0.3, 1.3))  # any phase of the 1 s poll
                changed.clear()
                proc = await asyncio.create_subprocess_exec(command, str(job), env=sge,
                                                            stdout=asyncio.subprocess.DEVNULL,
                                                            stderr=asyncio.subprocess.DEVNULL)
                await proc.wait()
                t_change = time.monotonic()
                while latest["state"] != target:
                    try:
                        await asyncio.wait_for(changed.wait(), timeout=10)
                    except asyncio.TimeoutError:
                        raise RuntimeError(f"no snapshot with the job {target} within 10 s") from None
                    changed.clear()
                ws_s = latest["at"] - t_change
                for _ in range(50):  # the database watcher reads every 20 ms: let it catch up
                    if db_seen["state"] == target:
                        break
                    await asyncio.sleep(0.02)
                db_s = (db_seen["at"] - t_change) if db_seen["state"] == target else float("nan")
                ws_lat.append(ws_s)
                db_lat.append(db_s)
                print(f"{i + 1:>3} {command:<8} {db_s:10.3f} {ws_s:12.3f}")
            reader.cancel()
    stop.set()
    good_db = [x for x in db_lat if x == x]
    from bench._hosts import cluster_label

    print(f"\n{len(ws_lat)} changes (poll interval {os.environ.get('TCO_POLL_INTERVAL_S', '1.0')} s; "
          f"{cluster_label()})")
    print(f"{'':<28} {'p50 s':>7} {'p95 s':>7} {'max s':>7}")
    print(f"{'database (baseline: poll)':<28} {statistics.median(good_db):7.3f} {pct(good_db, 0.95):7.3f} "
          f"{max(good_db):7.3f}")
    print(f"{'WebSocket (page updated)':<28} {statistics.median(ws_lat):7.3f} {pct(ws_lat, 0.95):7.3f} "
          f"{max(ws_lat):7.3f}")
    push = [w - d for w, d in zip(ws_lat, db_lat) if d == d]
    print(f"{'push path (WebSocket - db)':<28} {statistics.median(push):7.3f} {pct(push, 0.95):7.3f} {max(push):7.3f}")
    p95 = pct(ws_lat, 0.95)
    print(f"\nWebSocket p95 {p95:.3f} s (goal <= 2 s): {'OK' if p95 <= 2.0 else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
