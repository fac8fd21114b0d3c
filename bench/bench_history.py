"""A busy site's year of history in PostgreSQL: page times (p95) over it, what serves each query, bytes per row.

Issue 26. Fills a PostgreSQL database of its own (``tco_bench_history`` by
default: made here, dropped at the end unless ``--keep``) with a year of a
busy site, through tco's own bulk paths: campaigns' tasks with
``core.bulk.insert_varying`` (as launch and the poll write them), their
accounting records with ``core.bulk.store_accounting_records`` (the ingest's
store, which keeps the usage rollups in the same statement), the ended tasks
into the rollups with ``core.rollups.tasks_added`` (the ingest's hook), and
their model requests with ``insert_varying``. At ``--scale 1`` (the default):
50 teams, 2,000,000 tasks, 20,000,000 model requests (10 a task),
accounting records for all of them plus 5 % of jobs tco did not launch,
spread over the 365 days before now; one probe campaign of 10,000 tasks
(whatever the scale) for the campaign-sized pages; a live queue (running,
finishing and pending tasks) in ten teams; a monthly budget per team.

Then, each page ``--runs`` times after a warm-up (server time through
Django's test client, no network), p95 and median, beside two baselines of
the same run: a ``SELECT 1`` round trip (the floor) and, for the bills, the
same bill summed from the detail rows alone (what tco read before the
rollups):

* the bills page: a day, a week and a month by day, a quarter by week; per
  team and per campaign; as an admin (all 50 teams) and as one team's lead;
  the bill alone beside the same bill read from the hour rollups only (no
  day grain: the code before migration 0023) and from the detail rows;
* the costliest tasks of the probe campaign: page 1 and page 250;
* the probe campaign's stage histograms (cache off) and its campaign page;
* ``/api/usage/``: last month, and this month to now (not whole hours);
* the waste view: a month and a week (admin, lead) and one campaign; its
  sums alone beside the same sums from the hour rollups only;
* the FOCUS export of last month (``/ops/bills.focus.csv``; goal <= 10 s).

For every query of one run of each page, ``EXPLAIN`` says which indexes and
tables it read; a sequential scan of a table with more than 10,000 rows is
flagged ("reads all rows"). Last, bytes on disk per model request and per
task (``pg_total_relation_size``: the table, its TOAST and its indexes,
divided by its rows). Results also go to ``var/bench-history-<UTC time>.json``.

Needs the server of ``scripts/postgres`` (or ``DATABASE_URL`` naming a role
that may create databases) and Redis (the pages' cache). Run under the
shared lock, as root or as tco:

    flock /var/lock/tco-cluster.lock .venv/bin/python bench/bench_history.py --scale 0.05

``--scale 1`` takes the better part of an hour on 2 cores and about 10 GB
of disk; ``--keep`` leaves the database for ``--reuse`` (measure again
without filling); ``--fill-only`` fills, keeps and measures nothing. On a
shared host run it at the lowest priority (``nice -n 19 ionice -c3``).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _django import isolate_state  # noqa: E402
from bench_pg_ingest import server_url  # noqa: E402

TEAMS = 50
TASKS = 2_000_000
REQUESTS_PER_TASK = 10
DAYS = 365
PROBE_TASKS = 10_000
NOT_TCO_SHARE = 0.05
SIZES = (20, 50, 100, 200, 400, 800, 1500, 3000)
SIZE_WEIGHTS = (10, 15, 20, 20, 15, 10, 6, 4)
MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1", "")
#: USD per million tokens (input, cache read, cache write 5m, output), for the synthetic costs.
PRICES = {"claude-sonnet-4-5": (3, 0.3, 3.75, 15), "claude-haiku-4-5": (1, 0.1, 1.25, 5),
          "claude-opus-4-1": (15, 1.5, 18.75, 75), "": (3, 0.3, 3.75, 15)}
BIG_TABLE_ROWS = 10_000


# --------------------------------------------------------------------------- set-up

def bench_database(base_url: str, name: str) -> str:
    rest = base_url.split("://", 1)[1]
    return base_url.split("://", 1)[0] + "://" + re.sub(r"/[^/?]*(\?|$)", f"/{name}\\1", rest, count=1)


def setup_django(url: str, state: Path) -> None:
    isolate_state(state)
    os.environ["DATABASE_URL"] = url
    os.environ.pop("DATABASE_URL_FILE", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tco_web.settings"
    os.environ.setdefault("TCO_REDIS_DB", "6")
    os.environ["TCO_STAGE_CACHE_S"] = "0"  # the stage histograms are measured, not their cache
    os.environ["ALLOWED_HOSTS"] = "testserver,localhost,127.0.0.1"
    import django

    django.setup()


# --------------------------------------------------------------------------- the fill

class Filler:
    """Writes the history through tco's bulk paths, one campaign a transaction."""

    def __init__(self, *, scale: float, seed: int = 26) -> None:
        from django.utils import timezone

        self.rng = random.Random(seed)
        self.scale = scale
        self.now = timezone.now().replace(microsecond=0)
        self.start = self.now - dt.timedelta(days=DAYS)
        self.job = 100_000
        self.counts = {"tasks": 0, "requests": 0, "records": 0, "campaigns": 0, "not_tco_records": 0}
        # 1,000 request shapes, reused: drawing 20 million requests one by one would time Python, not tco.
        self.shapes = []
        for _ in range(1000):
            out = self.rng.randint(100, 2500)
            self.shapes.append((self.rng.randint(200, 6000), self.rng.choice([0, self.rng.randint(1000, 30000)]),
                                self.rng.choice([0, 0, self.rng.randint(100, 3000)]), 0, out,
                                self.rng.randint(0, out // 2), round(self.rng.uniform(300, 9000), 1)))

    def base(self) -> None:
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        from dashboards.core.accounts import team_ensure
        from dashboards.core.clusters import cluster_get_default
        from dashboards.core.roles import membership_set
        from dashboards.models import AgentDefinition, Budget
        from dashboards.team_models import Role

        call_command("migrate", verbosity=0)
        os.environ.setdefault("TCO_ADMIN_PASSWORD", "bench-admin-pw")
        call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
        self.cluster = cluster_get_default()
        self.agent = AgentDefinition.objects.get(name="demo-agent")
        User = get_user_model()
        self.teams = []
        for i in range(TEAMS):
            team = team_ensure(name=f"team{i:02d}", project=f"team{i:02d}")
            lead, _ = User.objects.get_or_create(username=f"lead{i:02d}")
            launcher, _ = User.objects.get_or_create(username=f"launcher{i:02d}")
            membership_set(user=lead, team=team, role=Role.LEAD)
            membership_set(user=launcher, team=team, role=Role.LAUNCHER)
            Budget.objects.get_or_create(team=team, period="month",
                                         defaults={"amount_usd": Decimal("5000"), "thresholds": [0.8, 1.0]})
            self.teams.append((team, lead, launcher))

    def cost(self, model: str, shape: tuple) -> Decimal:
        p = PRICES[model]
        usd = (shape[0] * p[0] + shape[1] * p[1] + shape[2] * p[2] + shape[4] * p[3]) / 1_000_000
        return Decimal(str(round(usd, 8)))

    def campaign(self, team, launcher, size: int, launched: dt.datetime, *, name: str, live: bool = False) -> int:
        """One finished campaign (or, with ``live``, one still running) and everything its tasks left."""
        from django.db import transaction

        from dashboards.core import bulk, rollups
        from dashboards.models import Campaign, ModelRequest, Task
        from schedulers.base import AccountingRecord as Parsed

        rng = self.rng
        model = rng.choice(MODELS)
        self.job += 1
        job = self.job
        spread = dt.timedelta(seconds=size * 600 / 96)  # 96 slots, 10-minute agents
        with transaction.atomic():
            campaign = Campaign.objects.create(
                name=name, cluster=self.cluster, team=team, agent_definition=self.agent, launched_by=launcher,
                queue="agent.q", task_count=size, status="running" if live else "finished", launched_at=launched,
                submitted_at=launched + dt.timedelta(seconds=0.2), job_number=job, model=model,
                finished_at=None if live else launched + spread + dt.timedelta(hours=1))
            fields = ("task_number", "state", "active", "submitted_at", "started_at", "ended_at", "gone_at", "host",
                      "wallclock_s", "cpu_s", "maxvmem_bytes", "failed_code", "exit_status", "task_started_at",
                      "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
                      "teardown_done_at", "runner_record", "input_tokens", "cache_read_tokens",
                      "cache_write_5m_tokens", "output_tokens", "reasoning_tokens", "cost_usd", "verdict")
            rows, records, requests, numbers = [], [], [], {}
            for n in range(1, size + 1):
                submitted = launched + dt.timedelta(seconds=1)
                began = launched + spread * (n / size) + dt.timedelta(seconds=rng.randint(2, 30))
                wall = rng.randint(60, 1800)
                ended = began + dt.timedelta(seconds=wall)
                state = "failed" if rng.random() < 0.03 else "done"
                if live:
                    if began > self.now - dt.timedelta(minutes=5):
                        rows.append((n, "pending", True, submitted, None, None, None, "", *([None] * 12),
                                     0, 0, 0, 0, 0, None, ""))
                        continue
                    # Ended more than two minutes ago: its accounting record was read (done or failed);
                    # since then: finishing (its runner record read, not yet its accounting); else running.
                    if ended > self.now:
                        state = "running"
                    elif ended > self.now - dt.timedelta(minutes=2):
                        state = "finishing"
                ready = began + dt.timedelta(milliseconds=rng.randint(15, 90))
                exited = ended - dt.timedelta(milliseconds=rng.randint(50, 400))
                shape_ids = [(n * 7 + k * 131 + job) % 1000 for k in range(REQUESTS_PER_TASK)]
                tokens = [sum(self.shapes[s][b] for s in shape_ids) for b in range(6)]
                costs = [self.cost(model, self.shapes[s]) for s in shape_ids]
                has_usage = state != "running"
                runner = None
                if has_usage:
                    runner = {"version": 2, "campaign_id": campaign.pk, "task_number": n, "job_number": job,
                              "hostname": f"sge-exec{1 + n % 2}",
                              "stages": {"task_started_at": began.isoformat(), "sandbox_create_at": began.isoformat(),
                                         "sandbox_ready_at": ready.isoformat(), "agent_started_at": ready.isoformat(),
                                         "agent_exited_at": exited.isoformat(), "teardown_done_at": ended.isoformat()},
                              "exit_status": 0 if state == "done" else 1, "signal": None,
                              "stdout_path": f"/var/spool/tco/work/{campaign.pk}/{n}/stdout",
                              "stderr_path": f"/var/spool/tco/work/{campaign.pk}/{n}/stderr",
                              "stdout_truncated": False, "stderr_truncated": False,
                              "outputs": [{"name": "verdict.json", "bytes": 41,
                                           "path": f"/var/spool/tco/records/{campaign.pk}/{n}.outputs/verdict.json"}],
                              "sandbox": {"runtime": "bubblewrap", "policy_version": 1},
                              "usage": {"input_tokens": tokens[0], "output_tokens": tokens[4],
                                        "requests": REQUESTS_PER_TASK, "cost_usd": str(sum(costs))},
                              "requests_path": f"/var/spool/tco/records/{campaign.pk}/{n}.requests.jsonl",
                              "usage_file": None, "flags": [], "runner_signal": None, "error": None,
                              "ingest": {"requests": REQUESTS_PER_TASK, "requests_kept": REQUESTS_PER_TASK,
                                         "requests_skipped": 0}}
                done = state in ("done", "failed")
                rows.append((n, state, not done, submitted, began, ended if state != "running" else None,
                             ended if state != "running" else None, f"sge-exec{1 + n % 2}",
                             wall if done else None, wall * 0.8 if done else None, 2.1e8 if done else None,
                             0 if done else None, (0 if state == "done" else 1) if done else None, began, began, ready,
                             ready, exited if has_usage else None, ended if has_usage else None, runner,
                             *(tokens[:3] if has_usage else (0, 0, 0)), *(tokens[4:6] if has_usage else (0, 0)),
                             sum(costs) if has_usage else None,
                             ("ok" if rng.random() < 0.7 else "bad") if state == "done" else ""))
                if done:
                    records.append(Parsed(
                        job_number=job, task_number=n, pe_taskid=None, job_name=f"tco-bench-c{campaign.pk}-{name}"[:255],
                        owner="tco", group="tco", project=team.project, department="defaultdepartment", account="sge",
                        queue="agent.q", hostname=f"sge-exec{1 + n % 2}", slots=1, submitted_at=submitted,
                        started_at=began, ended_at=ended, wallclock_s=float(wall), cpu_s=wall * 0.8,
                        maxvmem_bytes=2.1e8, failed=0, exit_status=0 if state == "done" else 1,
                        category="-q agent.q -l anthropic_api=1", usage={}))
                    numbers[len(records) - 1] = n
                if has_usage:
                    for k, s in enumerate(shape_ids):
                        shape = self.shapes[s]
                        requests.append((n, k + 1, began + dt.timedelta(seconds=20 * k), *shape[:6], costs[k],
                                         shape[6]))
            template = Task(cluster=self.cluster, campaign=campaign, job_number=job, is_array=True,
                            name=f"tco-bench-c{campaign.pk}-{name}"[:255], owner="tco", project=team.project,
                            queue="agent.q", slots=1, first_seen_at=launched)
            bulk.insert_varying(template, fields, rows)
            ids = dict(Task.objects.filter(campaign=campaign).values_list("task_number", "id"))
            rq = ModelRequest(provider="anthropic", method="POST", path="/v1/messages", status=200,
                              requested_model=model, model=model, complete=True, flags=[], cache_write_1h_tokens=0)
            bulk.insert_varying(rq, ("task_id", "seq", "at", "input_tokens", "cache_read_tokens",
                                     "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens",
                                     "reasoning_tokens", "cost_usd", "latency_ms"),
                                [(ids[r[0]], *r[1:]) for r in requests])
            # As ingest does: tasks made ended go into the rollups at once (with their requests); their
            # records then go in as the accounting ingest stores them (usage and waste rollups).
            rollups.tasks_added(ids.values())
            bulk.store_accounting_records(self.cluster, records, {i: ids[n] for i, n in numbers.items()})
        self.counts["tasks"] += size
        self.counts["requests"] += len(requests)
        self.counts["records"] += len(records)
        self.counts["campaigns"] += 1
        return campaign.pk

    def not_tco(self, count: int) -> None:
        """Accounting records of jobs tco did not launch (another account's ``qsub -P <team>``)."""
        from django.db import transaction

        from dashboards.core import bulk
        from schedulers.base import AccountingRecord as Parsed

        rng = self.rng
        batch = []
        for i in range(count):
            team = self.teams[rng.randrange(TEAMS)][0]
            began = self.start + dt.timedelta(seconds=rng.randint(0, DAYS * 86400 - 7200))
            wall = rng.randint(10, 7200)
            batch.append(Parsed(
                job_number=5_000_000 + i, task_number=None, pe_taskid=None, job_name="analysis", owner="alice",
                group="users", project=team.project, department="defaultdepartment", account="sge",
                queue="classic.q", hostname="sge-exec3", slots=rng.choice([1, 1, 2, 4]),
                submitted_at=began - dt.timedelta(seconds=30), started_at=began,
                ended_at=began + dt.timedelta(seconds=wall), wallclock_s=float(wall), cpu_s=float(wall),
                maxvmem_bytes=1e8, failed=0, exit_status=0, category="-q classic.q", usage={}))
            if len(batch) == 20_000 or i == count - 1:
                with transaction.atomic():
                    bulk.store_accounting_records(self.cluster, batch)
                batch = []
        self.counts["not_tco_records"] += count

    def resumed(self) -> set[str]:
        """The campaigns a stopped fill committed (one a transaction): their names, and the counts
        and next job number from the rows."""
        from django.db.models import Max

        from dashboards.models import AccountingRecord, Campaign, ModelRequest, Task

        names = set(Campaign.objects.values_list("name", flat=True))
        self.job = (Campaign.objects.aggregate(m=Max("job_number"))["m"] or self.job) + 1
        self.counts.update(tasks=Task.objects.count(), requests=ModelRequest.objects.count(),
                           records=AccountingRecord.objects.count(), campaigns=len(names))
        print(f"resuming: {len(names):,} campaigns, {self.counts['tasks']:,} tasks already stored", flush=True)
        return names

    def retried(self, *args, **kwargs) -> int:
        """:meth:`campaign`, again after the server went away (a restart by another suite on a shared
        host): each campaign is one transaction, so a failed one left nothing."""
        from django.db import InterfaceError, OperationalError, connection

        for attempt in range(30):
            try:
                return self.campaign(*args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                print(f"  server gone ({str(exc).splitlines()[0][:100]}); again in 10 s", flush=True)
                connection.close()
                time.sleep(10)
        raise SystemExit("the database server did not come back")

    def fill(self, *, resume: bool = False) -> dict:
        t0 = time.perf_counter()
        self.base()
        done = self.resumed() if resume else set()
        rng = self.rng
        per_team = int(TASKS * self.scale / TEAMS)
        plans = []
        for index, (team, _lead, launcher) in enumerate(self.teams):
            left = per_team
            while left > 0:
                size = min(left, rng.choices(SIZES, SIZE_WEIGHTS)[0])
                launched = self.start + dt.timedelta(seconds=rng.randint(0, (DAYS - 1) * 86400))
                plans.append((launched, team, launcher, size))
                left -= size
        plans.sort(key=lambda p: p[0])
        team0, _lead0, launcher0 = self.teams[0]
        probe_at = (self.now - dt.timedelta(days=40)).replace(hour=9, minute=0, second=0)
        last_report = time.perf_counter()
        probe = None
        if "probe" in done:
            from dashboards.models import Campaign

            probe = Campaign.objects.get(name="probe").pk
        for i, (launched, team, launcher, size) in enumerate(plans):
            if probe is None and launched >= probe_at:
                probe = self.retried(team0, launcher0, PROBE_TASKS, probe_at, name="probe")
            if f"c{i}" not in done:
                self.retried(team, launcher, size, launched, name=f"c{i}")
            if time.perf_counter() - last_report > 30:
                last_report = time.perf_counter()
                print(f"  ... {self.counts['tasks']:,} tasks, {self.counts['requests']:,} requests "
                      f"({last_report - t0:.0f} s)", flush=True)
        if probe is None:
            probe = self.retried(team0, launcher0, PROBE_TASKS, probe_at, name="probe")
        for team, _lead, launcher in self.teams[:10]:  # the live queue: running, finishing and pending tasks
            self.retried(team, launcher, 800, self.now - dt.timedelta(hours=1, minutes=20), name="live", live=True)
        self.not_tco(int(self.counts["records"] * NOT_TCO_SHARE))
        fill_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
        return {"probe": probe, "fill_s": round(fill_s, 1), "vacuum_analyze_s": round(time.perf_counter() - t1, 1),
                **self.counts}


# --------------------------------------------------------------------------- measuring

def timed(fn, runs: int) -> dict:
    fn()  # warm-up (connections, templates, the database's cache)
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return {"p95_ms": round(samples[min(len(samples) - 1, int(round(0.95 * (len(samples) - 1))))], 1),
            "median_ms": round(statistics.median(samples), 1), "max_ms": round(samples[-1], 1), "runs": runs}


def plan_nodes(plan: dict, out: list) -> None:
    node = plan.get("Node Type", "")
    rel = plan.get("Relation Name")
    if rel or "Index" in node:
        out.append({"node": node, "relation": rel, "index": plan.get("Index Name"),
                    "rows": plan.get("Plan Rows")})
    for child in plan.get("Plans", []):
        plan_nodes(child, out)


def explain(queries: list[str], table_rows: dict[str, int]) -> dict:
    """What the ``queries`` read: ``{"indexes": [...], "tables": [...], "seq_scans": [...],
    "full_scans": [big tables read whole]}``."""
    from django.db import connection

    indexes, tables, seqs, full = set(), set(), set(), set()
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, tablename FROM pg_indexes WHERE schemaname = 'public'")
        index_table = dict(cur.fetchall())
        for sql in queries:
            declared = re.match(r"\s*DECLARE .*? CURSOR (?:WITH(?:OUT)? HOLD )?FOR (SELECT .*)", sql, re.S)
            if declared:  # a server-side cursor's query (QuerySet.iterator)
                sql = declared.group(1)
            if not sql.lstrip().upper().startswith("SELECT") or "pg_" in sql:
                continue
            cur.execute("EXPLAIN (FORMAT JSON) " + sql)
            nodes: list = []
            plan_nodes(cur.fetchone()[0][0]["Plan"], nodes)
            for n in nodes:
                if n["index"]:
                    indexes.add(f"{n['index']} ({n['relation'] or index_table.get(n['index'], '?')})")
                if n["relation"]:
                    tables.add(n["relation"])
                if n["node"] == "Seq Scan":
                    seqs.add(n["relation"])
                    if table_rows.get(n["relation"], 0) > BIG_TABLE_ROWS:
                        full.add(f"{n['relation']} ({table_rows[n['relation']]:,} rows)")
    return {"indexes": sorted(indexes), "seq_scans": sorted(seqs), "full_scans": sorted(full)}


@contextlib.contextmanager
def hour_grain_only():
    """Bills and waste read every hour from the hour rollups, none from the day rollups: the code
    before the day grain (issue 26), the baseline each bill and waste figure is measured beside."""
    from dashboards.billing import grains

    real = grains.pieces
    grains.pieces = lambda begin, end, boundaries=(): ([], [(begin, end)] if begin < end else [])
    try:
        yield
    finally:
        grains.pieces = real


def captured(fn) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        fn()
    return [q["sql"] for q in ctx.captured_queries]


def sizes() -> dict:
    from django.db import connection

    from dashboards.models import AccountingRecord, ModelRequest, Task, TaskEvent, UsageRollup, WasteRollup
    from dashboards.rollup_models import UsageDayRollup, WasteDayRollup

    out = {}
    with connection.cursor() as cur:
        for model in (ModelRequest, Task, AccountingRecord, UsageRollup, UsageDayRollup, WasteRollup, WasteDayRollup,
                      TaskEvent):
            table = model._meta.db_table
            cur.execute("SELECT pg_relation_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s), "
                        "(SELECT count(*) FROM " + connection.ops.quote_name(table) + ")", [table] * 3)
            heap, idx, total, rows = cur.fetchone()
            cur.execute("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                        "WHERE indrelid = %s::regclass ORDER BY 2 DESC", [table])
            out[table] = {"rows": rows, "heap_bytes": heap, "index_bytes": idx, "total_bytes": total,
                          "bytes_per_row": round(total / rows, 1) if rows else None,
                          "index_bytes_per_row": round(idx / rows, 1) if rows else None,
                          "indexes": {name: size for name, size in cur.fetchall()}}
    return out


def table_rows() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT relname, reltuples::bigint FROM pg_class WHERE relkind = 'r' "
                    "AND relnamespace = 'public'::regnamespace")
        return dict(cur.fetchall())


def measure(info: dict, runs: int) -> dict:
    from django.db import connection
    from django.test import Client
    from rest_framework.test import APIClient

    from dashboards.billing import bill_page, bills
    from dashboards.core.stages import campaign_stages
    from dashboards.core.accounts import api_token_rotate
    from dashboards.models import Campaign, Team
    from django.contrib.auth import get_user_model

    User = get_user_model()
    admin = User.objects.get(username="admin")
    lead = User.objects.get(username="lead00")
    team0 = Team.objects.get(project="team00")
    probe = Campaign.objects.get(pk=info["probe"])
    clients = {}
    for who, user in (("admin", admin), ("lead", lead)):
        c = Client()
        c.force_login(user)
        clients[who] = c
    rows = table_rows()
    today = dt.datetime.now(dt.timezone.utc).date()
    yesterday = today - dt.timedelta(days=1)
    week = today - dt.timedelta(days=today.weekday() + 7)
    month_end = today.replace(day=1) - dt.timedelta(days=1)
    month = month_end.replace(day=1)
    quarter_first_month = ((today.month - 1) // 3) * 3 + 1
    q_end = dt.date(today.year, quarter_first_month, 1) - dt.timedelta(days=1)
    q_start = dt.date(q_end.year, ((q_end.month - 1) // 3) * 3 + 1, 1)
    ranges = {"day": (yesterday, yesterday, "day"), "week": (week, week + dt.timedelta(days=6), "day"),
              "month": (month, month_end, "day"), "quarter": (q_start, q_end, "week")}
    results: dict = {"pages": {}}

    def select_one():
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchone()

    results["floor_select_1"] = timed(select_one, runs * 5)
    for span, (first, last, period) in ranges.items():
        for group_by in ("team", "campaign"):
            for who in ("admin", "lead"):
                query = {"period": period, "first": first.isoformat(), "last": last.isoformat(),
                         "group_by": group_by}
                if who == "lead":
                    query["team"] = team0.pk

                def page(who=who, query=query):
                    response = clients[who].get("/ops/bills/", query)
                    assert response.status_code == 200, response.status_code

                teams = list(Team.objects.all()) if who == "admin" else [team0]

                def summed(teams=teams, first=first, last=last, period=period, group_by=group_by, detail=False):
                    bills.bill(teams=teams, period=period, first=first, last=last, group_by=group_by,
                               from_detail=detail)

                def hours_only(summed=summed):
                    with hour_grain_only():
                        summed()

                key = f"bills {span} per {group_by} ({who})"
                results["pages"][key] = {**timed(page, runs), "explain": explain(captured(page), rows),
                                         "bill_alone": timed(summed, runs),
                                         "bill_alone_explain": explain(captured(summed), rows),
                                         "baseline_hour_grain": timed(hours_only, runs),
                                         "baseline_detail": timed(lambda: summed(detail=True), max(2, runs // 5)),
                                         "baseline_explain": explain(captured(lambda: summed(detail=True)), rows)}
                found = results["pages"][key]
                print(f"  {key}: page p95 {found['p95_ms']} ms; the bill alone {found['bill_alone']['p95_ms']} ms "
                      f"(hour rollups alone: {found['baseline_hour_grain']['p95_ms']} ms; from the detail rows: "
                      f"{found['baseline_detail']['p95_ms']} ms)", flush=True)
    for page_no in (1, 250):
        query = {"period": "day", "first": probe.launched_at.date().isoformat(),
                 "last": (probe.launched_at.date() + dt.timedelta(days=2)).isoformat(), "group_by": "campaign",
                 "campaign": probe.pk, "team": team0.pk, "tasks_page": page_no}

        def costliest(query=query):
            response = clients["lead"].get("/ops/bills/", query)
            assert response.status_code == 200 and b'id="costliest"' in response.content

        def costliest_only(page_no=page_no):
            bill_page.costliest_tasks(probe.pk, teams=[team0], offset=(page_no - 1) * 20, limit=21)

        key = f"costliest tasks of a {PROBE_TASKS:,}-task campaign, page {page_no}"
        results["pages"][key] = {**timed(costliest, runs), "explain": explain(captured(costliest_only), rows),
                                 "query_alone": timed(costliest_only, runs)}
        print(f"  {key}: p95 {results['pages'][key]['p95_ms']} ms", flush=True)

    def stages():
        campaign_stages(probe)

    def campaign_page():
        response = clients["lead"].get(f"/campaigns/{probe.pk}/")
        assert response.status_code == 200

    for key, fn in ((f"stage histograms of a {PROBE_TASKS:,}-task campaign (cache off)", stages),
                    (f"campaign page of a {PROBE_TASKS:,}-task campaign", campaign_page)):
        results["pages"][key] = {**timed(fn, runs), "explain": explain(captured(fn), rows)}
        print(f"  {key}: p95 {results['pages'][key]['p95_ms']} ms", flush=True)
    from dashboards.billing import waste

    for label, (first, last) in (("month", (month, month_end)), ("week", (week, week + dt.timedelta(days=6)))):
        for who in ("admin", "lead"):
            query = {"first": first.isoformat(), "last": last.isoformat()}
            if who == "lead":
                query["team"] = team0.pk

            def waste_page(who=who, query=query):
                response = clients[who].get("/ops/waste/", query)
                assert response.status_code == 200 and b"wasted" in response.content.lower(), response.status_code

            teams = list(Team.objects.all()) if who == "admin" else [team0]

            def waste_alone(teams=teams, first=first, last=last):
                waste.waste(teams=teams, first=first, last=last)

            def sums_alone(teams=teams, first=first, last=last):
                waste.waste(teams=teams, first=first, last=last, seats=False)

            def sums_hours_only(sums_alone=sums_alone):
                with hour_grain_only():
                    sums_alone()

            key = f"waste view, a {label} ({who})"
            results["pages"][key] = {**timed(waste_page, runs), "explain": explain(captured(waste_page), rows),
                                     "waste_alone": timed(waste_alone, max(2, runs // 4)),
                                     "sums_alone": timed(sums_alone, runs),
                                     "sums_explain": explain(captured(sums_alone), rows),
                                     "baseline_sums_hour_grain": timed(sums_hours_only, runs)}
            found = results["pages"][key]
            print(f"  {key}: page p95 {found['p95_ms']} ms (the waste function alone {found['waste_alone']['p95_ms']} "
                  f"ms; its sums without seat figures {found['sums_alone']['p95_ms']} ms, from the hour rollups "
                  f"alone {found['baseline_sums_hour_grain']['p95_ms']} ms)", flush=True)
    query = {"first": probe.launched_at.date().isoformat(),
             "last": (probe.launched_at.date() + dt.timedelta(days=2)).isoformat(), "team": team0.pk,
             "campaign": probe.pk}

    def waste_campaign():
        response = clients["lead"].get("/ops/waste/", query)
        assert response.status_code == 200

    key = f"waste view of a {PROBE_TASKS:,}-task campaign (lead)"
    results["pages"][key] = {**timed(waste_campaign, runs), "explain": explain(captured(waste_campaign), rows)}
    print(f"  {key}: p95 {results['pages'][key]['p95_ms']} ms", flush=True)
    # The FOCUS export of last month (goal <= 10 s), as the bills page links it: every team (admin), one (lead).
    for who in ("admin", "lead"):
        query = {"period": "day", "first": month.isoformat(), "last": month_end.isoformat()}
        if who == "lead":
            query["team"] = team0.pk

        def export(who=who, query=query):
            response = clients[who].get("/ops/bills.focus.csv", query)
            body = b"".join(response.streaming_content) if response.streaming else response.content
            assert response.status_code == 200, response.status_code
            return body

        body = export()
        key = f"FOCUS export of a month ({who})"
        results["exports"] = results.get("exports", {})
        results["exports"][key] = {**timed(export, max(2, runs // 5)), "rows": body.count(b"\n") - 1,
                                   "bytes": len(body), "explain": explain(captured(export), rows)}
        found = results["exports"][key]
        print(f"  {key}: p95 {found['p95_ms'] / 1000:.2f} s, {found['rows']:,} rows, {found['bytes']:,} bytes "
              f"(goal <= 10 s)", flush=True)
    for who, user in (("admin", admin), ("lead", lead)):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {api_token_rotate(user=user).key}")
        for label, params in (("last month", {"since": month.isoformat(), "until": (month_end + dt.timedelta(days=1))
                                               .isoformat()}),
                              ("this month to now", {})):
            def usage(api=api, params=params):
                response = api.get("/api/usage/", params)
                assert response.status_code == 200, response.content[:200]

            key = f"/api/usage/ {label} ({who})"
            results["pages"][key] = {**timed(usage, runs), "explain": explain(captured(usage), rows)}
            print(f"  {key}: p95 {results['pages'][key]['p95_ms']} ms", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the year's 2,000,000 tasks and 20,000,000 requests (default 1)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--db", default="tco_bench_history")
    parser.add_argument("--keep", action="store_true", help="leave the database (for --reuse)")
    parser.add_argument("--reuse", action="store_true", help="measure the database a --keep run left")
    parser.add_argument("--resume", action="store_true",
                        help="go on filling the database a stopped run left (its committed campaigns kept)")
    parser.add_argument("--fill-only", action="store_true", help="fill and keep the database, measure nothing "
                        "(then --reuse)")
    args = parser.parse_args()

    import psycopg

    base = server_url()
    url = bench_database(base, args.db)
    if not args.reuse and not args.resume:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.db}"')
            admin.execute(f'CREATE DATABASE "{args.db}"')
    state = Path(tempfile.mkdtemp(prefix="tco-bench-history-", dir=REPO / "var" if (REPO / "var").is_dir() else None))
    setup_django(url, state)
    from django.db import connection, connections

    try:
        if args.reuse:
            from dashboards.models import Campaign

            info = json.loads((REPO / "var" / f"{args.db}.json").read_text())
            assert Campaign.objects.filter(pk=info["probe"]).exists()
        else:
            print(f"filling {args.db}: scale {args.scale} ({int(TASKS * args.scale):,} tasks + a probe campaign of "
                  f"{PROBE_TASKS:,}, {REQUESTS_PER_TASK} requests a task, {TEAMS} teams, {DAYS} days)", flush=True)
            info = Filler(scale=args.scale).fill(resume=args.resume)
            (REPO / "var").mkdir(exist_ok=True)
            (REPO / "var" / f"{args.db}.json").write_text(json.dumps(info))
            if args.fill_only:
                print(f"filled: {info}; kept for --reuse", flush=True)
                args.keep = True
                return
        with connection.cursor() as cur:
            cur.execute("SELECT version()")
            server = cur.fetchone()[0].split(",")[0]
        print(f"filled: {info}", flush=True)
        print("sizes:", flush=True)
        size = sizes()
        for table, s in size.items():
            print(f"  {table}: {s['rows']:,} rows, {s['total_bytes'] / 2**20:,.1f} MiB, {s['bytes_per_row']} B/row "
                  f"({s['index_bytes_per_row']} B/row in {len(s['indexes'])} indexes)", flush=True)
        print("pages (p95 over runs, server time):", flush=True)
        results = measure(info, args.runs)
    finally:
        connections.close_all()
        if not args.keep:
            with psycopg.connect(base, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{args.db}"')
    out = {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": os.uname().nodename,
           "cpus": os.cpu_count(), "load": os.getloadavg(), "server": server, "scale": args.scale, "fill": info,
           "sizes": size, **results}
    path = REPO / "var" / f"bench-history-{out['at'][:19].replace(':', '')}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"floor (SELECT 1): p95 {results['floor_select_1']['p95_ms']} ms")
    worst = max(results["pages"].items(), key=lambda kv: kv[1]["p95_ms"])
    print(f"slowest page: {worst[0]} p95 {worst[1]['p95_ms']} ms (goal <= 300 ms)")
    for name, page in results.get("exports", {}).items():
        print(f"{name}: p95 {page['p95_ms'] / 1000:.2f} s (goal <= 10 s)")
    for name, page in {**results["pages"], **results.get("exports", {})}.items():
        if page["explain"]["full_scans"]:
            print(f"  reads all rows: {name}: {', '.join(page['explain']['full_scans'])}")
    mr = size["dashboards_modelrequest"]
    print(f"model request on disk: {mr['bytes_per_row']} B with its indexes (goal <= 1,024)")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
