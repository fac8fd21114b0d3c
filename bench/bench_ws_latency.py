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

``--burst`` measures the push path under a burst instead, with no cluster
(issue 15 items 4 and 5)::

    .venv/bin/python bench/bench_ws_latency.py --burst [--tasks 410] [--slots 96] [--watchers 50]

Two campaigns of ``--tasks`` tasks (research and engineering) are written to
the database; a scripted qstat (all pending; ``--slots`` start at once; every
few seconds a handful end and as many start) is applied by this process's
poll loop (``worker.tasks.poll_burst``, every ``TCO_POLL_INTERVAL_S``) while the
seed replay's watchers (demo/watch/: the admin and ``--watchers`` users of
both teams on the queue and campaign pages) timestamp each task's change,
through tco's web server (uvicorn, as scripts/services starts it) and its live
views' producer (``manage.py tco_live_publish``). The lag is from the scripted
qstat's change to the browser, so it is the poll period's phase plus the
database write plus the push. Needs Redis only (``REDIS_URL``).

Issue 22's figures (docs/benchmarks.md, docs/live.md)::

    .venv/bin/python bench/bench_ws_latency.py --burst --watchers 500 --storm-sockets 2
    .venv/bin/python bench/bench_ws_latency.py --burst --watchers 500 --storm-sockets 2 --cpu-hogs 8

500 clients of both teams, each on the queue page and page 1 of a campaign of
its team: the connect storm opens all 1,000 sockets at once (beside one socket
on the idle server), then the burst; ``--cpu-hogs`` run at ``--hog-nice`` (19)
in the cpu cgroup ``--hog-cgroup`` (scripts/dev-cluster's ``tco-jobs``, where it exists and
this account may write to it): what the dev cluster gives the jobs. The summary at the end prints each
goal's figure beside its baseline from the same run: delivery beside the poll's
own commit (what any page could show at best), the storm beside the idle
socket, the web server's resident memory beside its start.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
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


def fresh_django(db: Path):
    """A new database at ``db`` (migrated, bootstrapped) for this process; returns its admin."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    setup_django(db)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
    return get_user_model().objects.get(username="admin")


def fresh_log_dir() -> Path:
    log_dir = REPO / "var" / "bench-ws-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    return log_dir


def web_argv(port: int, server: str = "uvicorn", workers: int = 2) -> list[str]:
    """The web server's command line: ``uvicorn`` with ``workers`` processes (as scripts/services and
    the site's tco-web.service), or single-process ``daphne`` (what scripts/services ran before)."""
    if server == "daphne":
        return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tco_web.asgi:application"]
    return [sys.executable, "-m", "uvicorn", "tco_web.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--lifespan", "off", "--no-server-header", "--timeout-graceful-shutdown", "5",
            "--no-proxy-headers", "--ws-per-message-deflate", "false"]


def live_argv() -> list[str]:
    """The live views' producer, as scripts/services starts it."""
    return [sys.executable, "manage.py", "tco_live_publish"]


def wait_web(base: str, log_dir: Path) -> None:
    """Wait up to 30 s for the web server's /healthz; RuntimeError after."""
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"web server did not start; see {log_dir}/web.log") from None
            time.sleep(0.2)


def main() -> int:
    from demo.watch.browsers import raise_open_files

    raise_open_files()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--db", default=str(REPO / "var" / "bench-ws.sqlite3"))
    parser.add_argument("--burst", action="store_true", help="the push path under a scripted burst (no cluster)")
    parser.add_argument("--tasks", type=int, default=410, help="--burst: tasks of the two campaigns together")
    parser.add_argument("--slots", type=int, default=96, help="--burst: tasks starting at once")
    parser.add_argument("--watchers", type=int, default=50, help="--burst: clients besides the admin")
    parser.add_argument("--seconds", type=float, default=40.0, help="--burst: how long the scripted run goes")
    parser.add_argument("--cpu-hogs", type=int, default=0,
                        help="--burst: this many busy processes run meanwhile (a host loaded as during the replay: "
                             "96 agents on 2 cores)")
    parser.add_argument("--hog-nice", type=int, default=19,
                        help="--burst: the hogs' nice value (19: the jobs' CPU priority on the dev cluster, "
                             "scripts/dev-cluster)")
    parser.add_argument("--hog-cgroup", default="/sys/fs/cgroup/cpu/tco-jobs",
                        help="--burst: the cgroup v1 cpu group the hogs run in, as the jobs do on the dev cluster "
                             "(scripts/dev-cluster); not used where it does not exist or cannot be written")
    parser.add_argument("--web", choices=("uvicorn", "daphne"), default="uvicorn",
                        help="the web server: uvicorn with --web-workers processes (as scripts/services) or daphne")
    parser.add_argument("--web-workers", type=int, default=int(os.environ.get("TCO_WEB_WORKERS", "2")))
    parser.add_argument("--storm-sockets", default="4,2",
                        help="--burst: the connect storm before the run: each of --watchers clients opens this many "
                             "sockets at once (queue page + campaign pages 1..n-1); comma-separated: one storm each")
    args = parser.parse_args()
    if args.burst:
        return burst(args)
    if os.getuid() == 0:
        sys.exit("run as the submit account (runuser -u tco -- ...): Grid Engine refuses root")

    admin = fresh_django(Path(args.db))
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from dashboards.models import Task

    session = SessionStore()
    session[SESSION_KEY] = str(admin.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = admin.get_session_auth_hash()
    session.create()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_dir = fresh_log_dir()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    py = sys.executable
    subprocess.run([py, "-m", "celery", "-A", "tco_web", "purge", "-f"], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=60)
    procs = []
    for name, argv in (
        ("web", web_argv(port, args.web, args.web_workers)),
        ("live", live_argv()),
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
        wait_web(base, log_dir)
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


#: A campaign snapshot's page number (``campaign.campaign_detail``: "page", "pages", "per_page" in that order).
CAMPAIGN_PAGE = re.compile(r'"page":(\d+),"pages":')


async def open_sockets(base: str, plan: list[tuple[str, str, int]], timeout_s: float = 30.0) -> list:
    """Open every socket of ``plan`` (``[(session key, path, page)]``) at once; for each, the seconds
    from its opening to the first snapshot of its page, or what went wrong (a string). The sockets
    stay open until every one has its answer, as browsers' would, then close."""
    import aiohttp
    from django.conf import settings

    done = asyncio.Event()
    remaining = [len(plan)]

    def answered() -> None:
        remaining[0] -= 1
        if not remaining[0]:
            done.set()

    async def one(http, session_key: str, path: str, page: int):
        began = time.monotonic()
        headers = {"Origin": base, "Cookie": f"{settings.SESSION_COOKIE_NAME}={session_key}"}
        result: float | str | None = None
        try:
            async with http.ws_connect(base.replace("http", "ws", 1) + path, headers=headers, max_msg_size=0,
                                       timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                if page != 1:
                    await ws.send_json({"page": page})
                async with asyncio.timeout(timeout_s):
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        # The kind and the page from the text (snapshots.body's key order), not a parse of the
                        # whole snapshot: these clients share the server's 2 cores, a browser would not.
                        if msg.data.startswith('{"kind":"queue.snapshot"') or (
                                msg.data.startswith('{"kind":"campaign.snapshot"')
                                and (found := CAMPAIGN_PAGE.search(msg.data)) and int(found.group(1)) == page):
                            result = time.monotonic() - began
                            break
                if result is None:
                    result = f"closed ({ws.close_code}) before its first snapshot"
                answered()
                await done.wait()
        except Exception as exc:  # noqa: BLE001 - counted as a failed connect
            if result is None:
                result = f"{type(exc).__name__}: {exc}"
                answered()
        return result

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     cookie_jar=aiohttp.DummyCookieJar()) as http:
        return list(await asyncio.gather(*(one(http, key, path, page) for key, path, page in plan)))


def storm_row(label: str, results: list) -> str:
    """One line of the connect-storm table: sockets, p50/p95/max of the connect times (s), failures."""
    from demo.watch.lags import percentile

    ok = [r for r in results if isinstance(r, float)]
    failed = [r for r in results if not isinstance(r, float)]
    cell = (lambda v: "n/a" if v is None else f"{v:.3f}")
    return (f"{label:<44} {len(results):>7} {cell(percentile(ok, 0.5)):>7} {cell(percentile(ok, 0.95)):>7} "
            f"{cell(max(ok) if ok else None):>7} {len(failed):>6}" + (f"  e.g. {failed[0]}" if failed else ""))


def connect_storm(base: str, campaigns: list, watchers: int, sockets: list[int], server: str) -> tuple[list[str], list]:
    """The connect storm (``--storm-sockets``): one socket at a time on the idle server (5 times), then
    for each ``k`` of ``sockets``, ``watchers`` clients (users of both teams) opening ``k`` sockets
    each at once: the queue page and pages 1..k-1 of their team's campaign. ``server``: the web server,
    for the title. Returns the table's lines and the summary's rows (:func:`print_summary`)."""
    from demo.watch.users import session_for, watcher_users

    users = watcher_users(watchers)
    keys = [session_for(u) for u in users]
    campaign_of = {c.team.project: c.pk for c in campaigns}
    lines = [f"connect storm (web server: {server}; connect = socket opened -> first snapshot of its page, seconds)",
             f"{'what':<44} {'sockets':>7} {'p50':>7} {'p95':>7} {'max':>7} {'failed':>6}"]
    from demo.watch.lags import percentile

    idle = []
    for _ in range(5):
        idle += asyncio.run(open_sockets(base, [(keys[0], "/ws/queue/", 1)]))
    lines.append(storm_row("one socket on the idle server, 5 in turn", idle))
    idle_ok = [r for r in idle if isinstance(r, float)]
    rows = []
    for k in sockets:
        plan = []
        for user, key in zip(users, keys):
            project = user.username[len("replay-watch-"):].rsplit("-", 1)[0]
            plan.append((key, "/ws/queue/", 1))
            plan += [(key, f"/ws/campaigns/{campaign_of[project]}/", page) for page in range(1, k)]
        results = asyncio.run(open_sockets(base, plan))
        lines.append(storm_row(f"{watchers} clients x {k} sockets at once", results))
        ok = [r for r in results if isinstance(r, float)]
        rows.append((f"connect storm, {len(plan)} sockets at once: first snapshot p95",
                     "n/a" if not ok else f"{percentile(ok, 0.95):.3f} s"
                     + (f" ({len(results) - len(ok)} failed)" if len(ok) < len(results) else ""),
                     f"one socket on the idle server p95 {percentile(idle_ok, 0.95):.3f} s" if idle_ok else "",
                     "<= 2 s"))
        time.sleep(2)   # the server closes the storm's sockets
    return lines, rows


def burst(args) -> int:
    """``--burst`` (module doc)."""
    import datetime as dt

    admin = fresh_django(Path(args.db))
    from django.db import connection
    from django.utils import timezone

    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import AgentDefinition, Campaign, Task, Team
    from demo.watch.live import LiveWatch
    from demo.watch.report import render_live
    from schedulers.base import QstatTask

    cluster = cluster_get_default()
    now = timezone.now()
    half = args.tasks // 2
    campaigns, script = [], {}
    for n, (project, job) in enumerate((("research", 900001), ("engineering", 900002))):
        count = half if n == 0 else args.tasks - half
        team = Team.objects.get(project=project)
        c = Campaign.objects.create(name=f"burst-{project}", cluster=cluster, team=team,
                                    agent_definition=AgentDefinition.objects.get(name="demo-agent"),
                                    launched_by=admin, queue="agent.q", task_count=count, status="submitted",
                                    launched_at=now, submitted_at=now, job_number=job)
        campaigns.append(c)
        Task.objects.bulk_create([Task(cluster=cluster, campaign=c, job_number=job, task_number=i, is_array=True,
                                       name=f"tco-bench-c{c.pk}", owner="tco", project=project, state="pending",
                                       state_code="qw", submitted_at=now) for i in range(1, count + 1)])
        for i in range(1, count + 1):
            script[(job, i)] = project
    connection.close()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_dir = fresh_log_dir()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    from dashboards.core import live_bus

    store = live_bus.bus()
    for key in store.r.scan_iter(match=live_bus.PREFIX + "*"):   # a fresh live store (an earlier run's views)
        store.r.delete(key)
    web = subprocess.Popen(web_argv(port, args.web, args.web_workers), cwd=REPO, env=env,
                           stdout=open(log_dir / "web.log", "wb"), stderr=subprocess.STDOUT)
    live = subprocess.Popen(live_argv(), cwd=REPO, env=env, stdout=open(log_dir / "live.log", "wb"),
                            stderr=subprocess.STDOUT)
    lock = threading.Lock()
    state: dict[tuple[int, int], str] = {k: "pending" for k in script}

    def qstat() -> list:
        with lock:
            items = list(state.items())
        return qstat_of(items)

    def qstat_of(items) -> list:
        at = dt.datetime.now(dt.timezone.utc)
        return [QstatTask(job_number=j, task_number=t, name="burst", owner="tco", project=script[(j, t)], state=s,
                          state_code="r" if s == "running" else "qw", restarted=False,
                          queue="agent.q" if s == "running" else None, host="h1" if s == "running" else None,
                          slots=1, submitted_at=at - dt.timedelta(seconds=1), started_at=None, priority=0.5)
                for (j, t), s in items]

    stop = threading.Event()
    poll_s = float(os.environ.get("TCO_POLL_INTERVAL_S", "1.0"))

    from django.conf import settings as django_settings

    from worker.tasks import poll_burst

    # The poll runs in a process of its own, as in the poll worker: in this one it would share the GIL
    # with hundreds of clients' sockets and the measured poll would be theirs. It reads the script's
    # state from a manager's dict, written here at each change.
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    manager = mp.Manager()
    shared, polls_out, stop_polls = manager.dict(), manager.list(), mp.Event()

    def share_state() -> None:   # with lock held
        shared["state"] = json.dumps([[j, t, s] for (j, t), s in state.items()])

    def poller() -> None:
        # As the beat and worker.tasks.poll_queue: one poll task every TCO_POLL_INTERVAL_S, polling
        # again every TCO_POLL_BURST_S while a burst goes on.
        import django.db

        django.db.connections.close_all()   # the parent's, copied by the fork: never used here
        scripted = (lambda: qstat_of([((j, t), s) for j, t, s in json.loads(shared["state"])]))
        while not stop_polls.is_set():
            began, began_at = time.monotonic(), time.time()
            out = poll_burst(cluster, scripted, budget_s=poll_s * 0.75, every_s=django_settings.TCO_POLL_BURST_S)
            polls_out.append((began_at, time.monotonic() - began, out["changed"] + out["gone"] + out["added"]))
            stop_polls.wait(max(0.0, poll_s - (time.monotonic() - began)))
        django.db.connections.close_all()

    with lock:
        share_state()

    procs = Path(args.hog_cgroup) / "cgroup.procs"
    hog_group = str(procs.parent) if args.cpu_hogs and os.access(procs, os.W_OK) else ""

    def hog_start() -> None:
        os.nice(args.hog_nice)
        if hog_group:
            procs.write_text(str(os.getpid()))

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=hog_start)
            for _ in range(args.cpu_hogs)]
    if hogs:
        print(f"{len(hogs)} busy processes run meanwhile at nice {args.hog_nice}"
              + (f" in cpu group {hog_group}" if hog_group else " (no cpu group)") + " (--cpu-hogs, --hog-nice)")
    summary: list[tuple[str, str, str, str]] = []
    try:
        wait_web(base, log_dir)
        storm = [int(k) for k in args.storm_sockets.split(",") if k.strip()] if args.watchers else []
        if storm:
            server = (f"{args.web}, {args.web_workers} processes" if args.web == "uvicorn" else "daphne, 1 process")
            lines, storms = connect_storm(base, campaigns, args.watchers, storm, server)
            print("\n".join(lines))
            summary += storms
            connection.close()
        watch = LiveWatch(base_url=base, watchers=args.watchers, list_tasks=qstat, admin=admin,
                          pids={"web": web.pid, "live": live.pid})
        watch.start()
        watch.follow(campaigns)
        import django.db

        django.db.connections.close_all()
        poll_process = mp.Process(target=poller, name="tco-bench-poll", daemon=True)
        poll_process.start()
        time.sleep(3)   # every socket connected, the poll in its stride
        order = sorted(state)
        order = [k for pair in zip(order[:half], order[half:]) for k in pair]   # the two teams in turn
        running = order[:args.slots]
        queue = order[args.slots:]
        with lock:
            for k in running:
                state[k] = "running"
            share_state()
        burst_at = time.time()
        print(f"{len(running)} tasks started at once; {len(queue)} queued")
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(random.uniform(0.5, 2.0))
            with lock:
                for _ in range(min(len(running), random.randint(1, 8))):
                    del state[running.pop(0)]
                    if queue:
                        k = queue.pop(0)
                        state[k] = "running"
                        running.append(k)
                share_state()
        time.sleep(3)
        stop.set()
        stop_polls.set()
        poll_process.join(timeout=30)
        polls = list(polls_out)   # (began, took s, tasks changed) of each poll task
        watch.stop()
        django.db.connections.close_all()
        results = watch.results()
        print("\n".join(render_live(results)))
        if os.environ.get("TCO_BENCH_TIMELINE"):
            print("timeline after the burst (s from it): polls (began, took, changed), the admin's snapshots "
                  "(arrival, generated)")
            for began, took, n in polls:
                if 0 <= began - burst_at < 4:
                    print(f"  poll task {began - burst_at:6.3f} took {took:.3f} changed {n}")
            for at, kind, generated in watch.clients[0].timeline:
                if 0 <= at - burst_at < 4:
                    gen = dt.datetime.fromisoformat(generated).timestamp() - burst_at if generated else float("nan")
                    print(f"  {kind:<40} arrived {at - burst_at:6.3f} generated {gen:6.3f}")
        busy = [(took, n) for _, took, n in polls if n]
        if busy:
            worst = max(busy)
            print(f"poll loop (burst re-poll every {django_settings.TCO_POLL_BURST_S} s): {len(polls)} poll tasks, "
                  f"{len(busy)} with changes; p50 "
                  f"{statistics.median(t for t, _ in busy):.3f} s, slowest {worst[0]:.3f} s ({worst[1]} tasks)")
        summary += burst_summary(results, polls)
        print_summary(summary, hogs=len(hogs), nice=args.hog_nice, clients=args.watchers)
    finally:
        stop.set()
        stop_polls.set()
        for hog in hogs:
            hog.kill()
        manager.shutdown()
        for proc in (web, live):
            proc.terminate()
        for proc in (web, live):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def burst_summary(results: dict, polls: list) -> list[tuple[str, str, str, str]]:
    """The burst's goal figures, each beside its baseline from the same run: ``(figure, measured,
    baseline, goal)``."""
    from demo.watch.lags import LAG_PARTS, percentile
    from demo.watch.report import live_figures

    f = live_figures(results)
    parts = f["load_breakdown"]["parts"]
    to_commit = [a + b for a, b in zip(parts[LAG_PARTS[0][0]], parts[LAG_PARTS[1][0]])]
    cell = (lambda v: "n/a" if v is None else f"{v:.3f} s")
    rows = []
    load = f["load"]
    rows.append((f"delivery p95, {f['clients']} clients (campaign pages)", cell(load["p95"]),
                 f"committed to the database (poll) p95 {cell(percentile(to_commit, 0.95))}", "<= 2 s"))
    rows.append(("delivery p99, clients (campaign pages)",
                 cell(percentile([x for c in results["clients"] if not c["admin"] for x in c["lag"]["lags"]], 0.99)),
                 "", "<= 3 s"))
    rows.append(("delivery p95, clients (queue page counts)", cell(f["load_queue"]["p95"]), "", "<= 2 s"))
    if "lag" in f:
        rows.append(("delivery p95, admin (every campaign page)", cell(f["lag"]["p95"]), "", "<= 2 s"))
    rows.append(("changes delivered / expected, clients",
                 f"{load['received']} / {load['expected']} (missed {load['missed']})", "", "all"))
    rows.append(("clients that saw another team's data", str(len(f["violations"])), "", "0"))
    rss = results["rss"].get("web")
    if rss:
        rows.append(("web RSS growth (children included)", f"{(rss['peak'] - rss['start']) / 2**20:.0f} MiB",
                     f"at start {rss['start'] / 2**20:.0f} MiB", "<= 150 MiB"))
    for kind, s in results["pages"].items():
        rows.append((f"{kind} GET p95", cell(s["p95"]), "", "<= 0.3 s"))
    return rows


def print_summary(rows: list[tuple[str, str, str, str]], *, hogs: int, nice: int, clients: int) -> None:
    print(f"\nSummary ({clients} clients; " + (f"{hogs} CPU hogs at nice {nice})" if hogs else "no CPU hogs)"))
    print(f"{'figure':<48} {'measured':>22}  {'baseline (same run)':<46} goal")
    for figure, measured, baseline, goal in rows:
        print(f"{figure:<48} {measured:>22}  {baseline:<46} {goal}")


if __name__ == "__main__":
    sys.exit(main())
