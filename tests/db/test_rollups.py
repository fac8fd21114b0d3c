"""Usage rollups kept at ingest (issue 26): equal to the detail rows, and bills over them exact.

Random usage goes in through tco's own paths (accounting ingest, runner
records before and after the accounting record, records read twice, tasks
no poll saw, tasks lost, jobs tco did not launch); the rollups are then
compared with sums computed here, in Python, from the detail rows, and every
bill (day, week, month; per team, model, campaign, launcher; three time
zones) with the same bill made from the detail rows alone. The retention
drop keeps the bills exact while the detail rows go.
"""
from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal

import pytest
from django.db import transaction

from dashboards.billing import bills, waste
from dashboards.core import bulk, errors, rollups
from dashboards.core.clusters import cluster_get_default
from dashboards.core.failures import failure_of
from dashboards.ingest import retention
from dashboards.ingest.accounting import _store_records
from dashboards.ingest.poll import reconcile_gone_tasks
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.models import (AccountingRecord, Cluster, ModelRequest, RequestRollup, Task, Team, UsageRollup,
                               WasteRollup)
from dashboards.rollup_models import KEY, REQUEST_KEY, SUMS, WASTE_KEY, WASTE_SUMS, UsageDayRollup
from schedulers.base import AccountingRecord as Parsed
from tests.support import budget
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc
START = dt.datetime(2026, 3, 2, 0, 0, tzinfo=UTC)  # a Monday; New York's DST starts on the 8th
BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens")


def parsed(job: int, task: int, *, submitted, started, ended, wall: float, slots: int, queue: str, project: str,
           failed: int = 0, exit_status: int = 0) -> Parsed:
    return Parsed(job_number=job, task_number=task, pe_taskid=None, job_name="x", owner="tco", group="tco",
                  project=project, department=None, account="", queue=queue, hostname="h1", slots=slots,
                  submitted_at=submitted, started_at=started, ended_at=ended, wallclock_s=wall, cpu_s=0.0,
                  maxvmem_bytes=0.0, failed=failed, exit_status=exit_status, category="", usage={})


def runner_record(spool, task: Task, rng: random.Random, *, version: int) -> None:
    """A runner record of ``task`` with a few metered requests (some unpriced) and maybe a verdict; a
    version 2 record may say its metering proxy never listened (flag ``proxy_error``, no requests),
    with or without a signal to the runner: the infrastructure's failure, or not, where the task failed."""
    requests = []
    flags = rng.choice([[], [], [], ["proxy_error"], ["proxy_error", "runner_signalled"]]) if version == 2 else []
    for n in range(0 if flags else rng.randint(0, 4)):
        usage = {b: rng.choice([0, rng.randint(1, 50_000)]) for b in BUCKETS}
        usage["reasoning_tokens"] = rng.randint(0, usage["output_tokens"])
        cost = None if rng.random() < 0.15 else str(Decimal(rng.randint(1, 10**7)) / Decimal(10**8))
        requests.append({"at": "2026-03-02T12:00:0%dZ" % n, "method": "POST", "path": "/v1/messages", "status": 200,
                         "refused": None, "model_requested": "m", "model_returned": "m",
                         "usage": {"provider": "anthropic", **usage}, "cost_usd": cost, "latency_ms": 3.0,
                         "complete": True, "flags": []})
    folder = spool / "records" / str(task.campaign_id)
    folder.mkdir(parents=True, exist_ok=True)
    outputs = []
    if rng.random() < 0.5:
        out = folder / f"{task.task_number}.outputs" / f"v{version}" / "verdict.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"verdict": rng.choice(["ok", "bad"])}))
        outputs.append({"name": "verdict.json", "path": str(out)})
    record = {"version": 1, "campaign_id": task.campaign_id, "task_number": task.task_number,
              "job_number": task.job_number, "stages": {}, "exit_status": 0, "requests": requests, "outputs": outputs,
              **({"flags": flags} if flags else {})}
    (folder / f"{task.task_number}.json").write_text(json.dumps(record))


def build_history(rng: random.Random, spool, users, *, start=START, days: int = 12) -> dict:
    """Random usage over ``days`` days from ``start``, stored through tco's ingest paths."""
    cluster = cluster_get_default()
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    campaigns = [make_campaign(team=rng.choice([research, engineering]),
                               user=rng.choice([users["launcher"], users["other"], users["lead"]]),
                               name=f"c{i}", model=rng.choice(["m-1", "m-2", ""]), job_number=5000 + i)
                 for i in range(5)]
    records: list[Parsed] = []
    seen: list[Task] = []
    for campaign in campaigns:
        for number in range(1, rng.randint(6, 14)):
            submitted = start + dt.timedelta(seconds=rng.randint(0, days * 86400))
            began = submitted + dt.timedelta(seconds=rng.randint(0, 7200))
            wall = rng.choice([rng.randint(1, 9000), round(rng.uniform(0.5, 3000), 6)])
            ended = began + dt.timedelta(seconds=wall)
            kind = rng.random()
            if kind < 0.85:  # a poll saw it run, then gone from qstat (finishing); else it ran between polls
                seen.append(Task.objects.create(
                    cluster=cluster, campaign=campaign, job_number=campaign.job_number, task_number=number,
                    is_array=True, project=campaign.team.project, state="finishing", active=True,
                    submitted_at=submitted, started_at=began, queue="agent.q", gone_at=ended))
            if kind < 0.75 or kind >= 0.85:  # else: no record ever comes (lost)
                failed = rng.choice([0, 0, 0, 1])
                records.append(parsed(campaign.job_number, number, submitted=submitted, started=began, ended=ended,
                                      wall=wall, slots=rng.randint(1, 4), queue=rng.choice(["agent.q", "classic.q"]),
                                      project=campaign.team.project, failed=failed,
                                      exit_status=rng.choice([0, 0, 2]) if not failed else 0))
    for job in range(9000, 9012):  # jobs tco did not launch, under a team's project or another
        began = start + dt.timedelta(seconds=rng.randint(0, days * 86400))
        wall = rng.randint(1, 4000)
        records.append(parsed(job, 0, submitted=began, started=began, ended=began + dt.timedelta(seconds=wall),
                              wall=wall, slots=rng.randint(1, 2), queue="classic.q",
                              project=rng.choice(["research", "engineering", "physics"])))
    early = rng.sample(seen, len(seen) // 2)
    for task in early:  # runner records read before the accounting record: the task is still active
        runner_record(spool, task, rng, version=1)
    assert ingest_runner_records(cluster, spool=spool).ingested == len(early)
    rng.shuffle(records)
    for i in range(0, len(records), 7):  # as ingest stores them: a batch a transaction
        with transaction.atomic():
            _store_records(cluster, records[i:i + 7])
    with transaction.atomic():
        assert _store_records(cluster, records[:9]) == (0, 0)  # read again: stored once
    late = [t for t in Task.objects.filter(campaign__isnull=False) if t.id not in {e.id for e in early}]
    for task in late + rng.sample(early, 3):  # after the accounting record (the task ended), or a second time
        runner_record(spool, task, rng, version=2)
    ingest_runner_records(cluster, spool=spool)
    reconcile_gone_tasks(cluster, now=start + dt.timedelta(days=days + 2))  # no record ever: lost
    # One task still running, with usage metered already: not in the rollups, in every bill.
    running = Task.objects.create(cluster=cluster, campaign=campaigns[0], job_number=campaigns[0].job_number,
                                  task_number=99, is_array=True, state="running", active=True,
                                  submitted_at=start, started_at=start + dt.timedelta(hours=5, minutes=10),
                                  queue="agent.q")
    runner_record(spool, running, rng, version=1)
    ingest_runner_records(cluster, spool=spool)
    return {"cluster": cluster, "teams": [research, engineering], "campaigns": campaigns}


def detail_sums() -> dict[tuple, list[int]]:
    """What the rollups must hold, computed here from the detail rows."""
    out: dict[tuple, list[int]] = {}

    def add(key, values: dict) -> None:
        row = out.setdefault(key, [0] * len(SUMS))
        for name, value in values.items():
            row[SUMS.index(name)] += value

    for t in Task.objects.filter(active=False, campaign__isnull=False, started_at__isnull=False):
        hour = t.started_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        tokens = {b: getattr(t, b) for b in (*BUCKETS, "reasoning_tokens")}
        add((t.cluster_id, hour, t.campaign_id, "", t.queue), {
            "tasks": 1, "finished_tasks": int(t.state in ("done", "failed")),
            "verdicts": int(t.state == "done" and t.verdict != ""),
            "unpriced_tasks": int(t.cost_usd is None and any(tokens[b] > 0 for b in BUCKETS)),
            "cost_units": int(t.cost_usd * 10**8) if t.cost_usd is not None else 0, **tokens})
    for r in AccountingRecord.objects.filter(started_at__isnull=False).select_related("task"):
        hour = r.started_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        campaign = r.task.campaign_id if r.task is not None and r.task.campaign_id else 0
        wall = round(r.wallclock_s * 1_000_000)
        add((r.cluster_id, hour, campaign, "" if campaign else r.project, r.queue),
            {"records": 1, "wallclock_us": wall, "slot_us": wall * r.slots})
    return out


def stored_sums() -> dict[tuple, list[int]]:
    out = {}
    for row in UsageRollup.objects.values_list(*KEY, *SUMS):
        if any(row[len(KEY):]):
            out[(row[0], row[1].astimezone(UTC), *row[2:len(KEY)])] = list(row[len(KEY):])
    return out


def comparable(result: dict) -> list[tuple]:
    """A bill's rows with wall clock to the microsecond (the rollups keep integer microseconds)."""
    def norm(row):
        return tuple(sorted((k, round(v, 6) if isinstance(v, float) else v) for k, v in row.items()
                            if k not in ("link", "page")))
    return [norm(r) for r in result["rows"]] + [norm(result["totals"]), norm(result["not_tco_totals"])]


def all_bills(teams, *, first: dt.date, last: dt.date, from_detail: bool, campaign: int | None = None) -> list:
    out = []
    for period in ("day", "week", "month"):
        for group_by in bills.GROUPS:
            out.append(comparable(bills.bill(teams=teams, period=period, first=first, last=last, group_by=group_by,
                                             from_detail=from_detail)))
    out.append(comparable(bills.bill(teams=teams, period="day", first=first, last=last, group_by="campaign",
                                     campaign=campaign, from_detail=from_detail)))
    out.append(comparable(bills.bill(teams=teams, period="week", first=first, last=last, group_by="team",
                                     model="m-1", from_detail=from_detail)))
    out.append(comparable(bills.bill(teams=teams, period="day", first=first, last=last, group_by="model",
                                     launcher="launcher", from_detail=from_detail)))
    return out


@pytest.mark.parametrize("seed", budget.seeds([1, 2, 3], check=1))  # all in make test, seed 1 in make check
def test_rollups_equal_the_detail_rows_and_bills_over_them_are_exact(seed, ops_users, tmp_path):
    history = build_history(random.Random(seed), tmp_path / "spool", ops_users)
    expected = {k: v for k, v in detail_sums().items() if any(v)}
    assert expected and stored_sums() == expected
    assert rollups.differences() == []
    # Bills from the rollups (and the active task's detail) equal bills from the detail rows alone,
    # to the cent and to the microsecond, in a whole-hour zone with a DST change and in a half-hour one.
    first, last = dt.date(2026, 3, 1), dt.date(2026, 3, 20)
    for zone in ("UTC", "America/New_York", "Asia/Kolkata"):
        Cluster.objects.filter(pk=history["cluster"].pk).update(time_zone=zone)
        assert all_bills(history["teams"], first=first, last=last, from_detail=False,
                         campaign=history["campaigns"][0].pk) == \
            all_bills(history["teams"], first=first, last=last, from_detail=True, campaign=history["campaigns"][0].pk)
    # The usage API's range need not start on an hour: the parts of an hour come from the detail rows.
    lead = ops_users["admin"]
    for since, until in ((START + dt.timedelta(minutes=17, seconds=3), START + dt.timedelta(days=5, minutes=41)),
                         (START + dt.timedelta(hours=5, minutes=1), START + dt.timedelta(hours=5, minutes=59)),
                         (START, START + dt.timedelta(days=30))):
        got = bills.usage_by_team(lead, since=since, until=until)
        want = bills.usage_by_team(lead, since=since, until=until, from_detail=True)
        for kind in ("teams", "not_launched_by_tco"):
            assert [sorted((k, round(v, 6) if isinstance(v, float) else v) for k, v in r.items()) for r in got[kind]] \
                == [sorted((k, round(v, 6) if isinstance(v, float) else v) for k, v in r.items()) for r in want[kind]]
    # A rebuild from the detail rows gives the same rows.
    rollups.rebuild()
    assert stored_sums() == expected


def test_the_bill_of_a_day_counts_the_tasks_rollups_and_active_detail_once(ops_users, tmp_path):
    """A hand-checked bill: what the rollups hold and the running task's detail, added once."""
    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], job_number=7000)
    day = dt.datetime(2026, 5, 4, 10, 30, tzinfo=UTC)
    task = Task.objects.create(cluster=cluster, campaign=campaign, job_number=7000, task_number=1, is_array=True,
                               state="finishing", active=True, submitted_at=day, started_at=day, gone_at=day)
    with transaction.atomic():
        _store_records(cluster, [parsed(7000, 1, submitted=day, started=day, ended=day + dt.timedelta(seconds=90),
                                        wall=90.25, slots=2, queue="agent.q", project="research")])
    with rollups.tasks_rolled([task.pk]):
        Task.objects.filter(pk=task.pk).update(cost_usd=Decimal("0.12345678"), output_tokens=7, verdict="ok")
    Task.objects.create(cluster=cluster, campaign=campaign, job_number=7000, task_number=2, is_array=True,
                        state="running", active=True, submitted_at=day, started_at=day + dt.timedelta(hours=1),
                        cost_usd=Decimal("1.00000001"), input_tokens=3)
    row = UsageRollup.objects.get()
    assert (row.tasks, row.finished_tasks, row.verdicts, row.cost_units, row.output_tokens, row.records,
            row.wallclock_us, row.slot_us) == (1, 1, 1, 12345678, 7, 1, 90_250_000, 180_500_000)
    assert row.hour == dt.datetime(2026, 5, 4, 10, tzinfo=UTC) and row.queue == "agent.q"
    result = bills.bill(teams=[research], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4))
    (only,) = result["rows"]
    assert only["tasks"] == 2 and only["finished_tasks"] == 1 and only["verdicts"] == 1 and only["records"] == 1
    assert only["cost_usd"] == Decimal("1.12345679") and only["total_tokens"] == 10
    assert only["wallclock_s"] == 90.25 and only["slot_s"] == 180.5


def test_retention_drops_old_detail_in_batches_and_bills_stay_exact(ops_users, tmp_path, settings):
    history = build_history(random.Random(7), tmp_path / "spool", ops_users, days=20)
    teams, campaign = history["teams"], history["campaigns"][0].pk
    first, last = dt.date(2026, 3, 1), dt.date(2026, 3, 31)
    before = all_bills(teams, first=first, last=last, from_detail=False, campaign=campaign)
    assert before == all_bills(teams, first=first, last=last, from_detail=True, campaign=campaign)
    wasted = rounded(waste.waste(teams=teams, first=first, last=last, seats=False))
    assert wasted == rounded(waste.waste(teams=teams, first=first, last=last, seats=False, from_detail=True))
    now = START + dt.timedelta(days=10, hours=7, minutes=25)
    cut = dt.datetime(2026, 3, 12, 7, tzinfo=UTC)  # now - 0 days, to the hour
    old_tasks = set(Task.objects.filter(active=False, ended_at__lt=cut).values_list("id", flat=True))
    kept_tasks = Task.objects.count() - len(old_tasks)
    assert old_tasks and ModelRequest.objects.filter(task_id__in=old_tasks).exists()
    old_records = AccountingRecord.objects.filter(ended_at__lt=cut).count()
    result = retention.drop_old_detail(history["cluster"], days=0.0001, now=now, batch=4)
    assert result.cutoff == cut and result.done and result.batches > 2
    assert result.tasks == len(old_tasks) and Task.objects.count() == kept_tasks
    assert not ModelRequest.objects.filter(task_id__in=old_tasks).exists()
    assert result.records == old_records and not AccountingRecord.objects.filter(ended_at__lt=cut).exists()
    assert Cluster.objects.get(pk=history["cluster"].pk).detail_dropped_before == cut
    # Bills and the waste sums over the retained rollups: the same figures as before the drop.
    assert all_bills(teams, first=first, last=last, from_detail=False, campaign=campaign) == before
    assert rounded(waste.waste(teams=teams, first=first, last=last, seats=False)) == wasted
    assert wasted["totals"]["spent"]["tasks"] > rounded(waste.waste(teams=teams, first=first, last=last, seats=False,
                                                                    from_detail=True))["totals"]["spent"]["tasks"]
    # The accounting file read again from its start: the dropped records are not stored a second time.
    cluster = Cluster.objects.get(pk=history["cluster"].pk)
    old = [parsed(9000 + n, 0, submitted=START + dt.timedelta(hours=n), started=START + dt.timedelta(hours=n),
                  ended=START + dt.timedelta(hours=n, seconds=5), wall=5, slots=1, queue="classic.q",
                  project="research") for n in range(3)]
    with transaction.atomic():
        assert _store_records(cluster, old) == (0, 0)
    assert all_bills(teams, first=first, last=last, from_detail=False, campaign=campaign) == before
    # A part of an hour before the cut has no detail left: refused, never summed short.
    with pytest.raises(errors.BillError, match="whole hours"):
        bills.usage_by_team(ops_users["admin"], since=START + dt.timedelta(minutes=30), until=now)
    again = retention.drop_old_detail(cluster, days=0.0001, now=now, batch=4)
    assert again.tasks == 0 and again.records == 0


def test_retention_is_off_by_default_and_keeps_a_half_hour_zones_detail(ops_users, settings):
    cluster = cluster_get_default()
    assert retention.drop_old_detail(cluster).skipped
    Cluster.objects.filter(pk=cluster.pk).update(time_zone="Asia/Kolkata")
    cluster.refresh_from_db()
    result = retention.drop_old_detail(cluster, days=1)
    assert "not whole hours" in result.skipped and result.tasks == 0
    assert Cluster.objects.get(pk=cluster.pk).detail_dropped_before is None
    assert retention.whole_hour_zone("America/New_York") and not retention.whole_hour_zone("Australia/Lord_Howe")


def test_the_command_checks_and_rebuilds(ops_users, tmp_path):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    build_history(random.Random(11), tmp_path / "spool", ops_users, days=2)
    out = StringIO()
    call_command("tco_rollups", "--check", stdout=out)
    assert "equal the detail rows" in out.getvalue() and "the day rows equal their hours" in out.getvalue()
    # an hour row edited by hand: it differs from its detail rows, and its day row from its hours
    UsageRollup.objects.filter(pk=UsageRollup.objects.order_by("pk").first().pk).update(records=12345)
    with pytest.raises(CommandError, match="2 rollup rows differ"):
        call_command("tco_rollups", "--check", stdout=StringIO())
    call_command("tco_rollups", "--rebuild", stdout=StringIO())
    call_command("tco_rollups", "--check", stdout=StringIO())
    # a day row edited by hand (the bills read whole days from it): only it differs, and it is named
    day = UsageDayRollup.objects.order_by("pk").first()
    UsageDayRollup.objects.filter(pk=day.pk).update(cost_units=day.cost_units + 1)
    out = StringIO()
    with pytest.raises(CommandError, match="1 rollup rows differ"):
        call_command("tco_rollups", "--check", stdout=out)
    assert f"day row != its hours: {{'cost_units': ({day.cost_units + 1}, {day.cost_units})}}" in out.getvalue()
    call_command("tco_rollups", "--rebuild", stdout=StringIO())
    call_command("tco_rollups", "--check", stdout=StringIO())


def test_bills_sum_across_clusters_and_split_by_them(ops_users, tmp_path):
    """Two cells: a team's bill sums both, per cluster splits them, a cluster filter narrows it, and
    the rollups and the detail rows agree."""
    research = Team.objects.get(project="research")
    first_cluster = cluster_get_default()
    second = Cluster.objects.create(name="second", sge_root="/var/lib/gridengine", sge_cell="second",
                                    accounting_path="/nonexistent", qmaster_port=6544, execd_port=6545)
    day = dt.datetime(2026, 5, 4, 10, tzinfo=UTC)
    for cluster, job, wall, cost in ((first_cluster, 7100, 100, "1.25"), (second, 7100, 40, "0.5")):
        campaign = make_campaign(team=research, user=ops_users["launcher"], name=f"on-{cluster.name}", job_number=job)
        type(campaign).objects.filter(pk=campaign.pk).update(cluster=cluster)
        task = Task.objects.create(cluster=cluster, campaign=campaign, job_number=job, task_number=1, is_array=True,
                                   state="finishing", active=True, submitted_at=day, started_at=day, gone_at=day)
        with transaction.atomic():
            _store_records(cluster, [parsed(job, 1, submitted=day, started=day,
                                            ended=day + dt.timedelta(seconds=wall), wall=wall, slots=1,
                                            queue="agent.q", project="research")])
        with rollups.tasks_rolled([task.pk]):
            Task.objects.filter(pk=task.pk).update(cost_usd=Decimal(cost))
    one_day = {"period": "day", "first": dt.date(2026, 5, 4), "last": dt.date(2026, 5, 4)}
    whole = bills.bill(teams=[research], **one_day)
    assert whole["totals"]["wallclock_s"] == 140 and whole["totals"]["cost_usd"] == Decimal("1.75")
    split = bills.bill(teams=[research], group_by="cluster", **one_day)
    assert {r["label"]: (r["wallclock_s"], r["cost_usd"]) for r in split["rows"]} == {
        first_cluster.name: (100, Decimal("1.25")), "second": (40, Decimal("0.5"))}
    assert comparable(split) == comparable(bills.bill(teams=[research], group_by="cluster", from_detail=True,
                                                      **one_day))
    only = bills.bill(teams=[research], clusters=[second], **one_day)
    assert only["totals"]["wallclock_s"] == 40 and only["totals"]["cost_usd"] == Decimal("0.5")


@pytest.mark.django_db(transaction=True)
def test_retention_drops_in_batches_while_ingest_stores(ops_users, tmp_path, bootstrap):
    """The drop and the accounting ingest at once, each in its own connection: neither fails, the
    new records are all stored, and the bills keep their figures (March as before the drop, the new
    records in April)."""
    import threading

    from django.db import connections

    history = build_history(random.Random(5), tmp_path / "spool", ops_users, days=20)
    teams, first, last = history["teams"], dt.date(2026, 3, 1), dt.date(2026, 3, 31)
    before = all_bills(teams, first=first, last=last, from_detail=False)
    assert before == all_bills(teams, first=first, last=last, from_detail=True)
    cluster = Cluster.objects.get(pk=history["cluster"].pk)
    now = dt.datetime(2026, 4, 11, 12, tzinfo=UTC)
    new = [parsed(8000 + n // 10, n % 10, submitted=now, started=now + dt.timedelta(minutes=n),
                  ended=now + dt.timedelta(minutes=n, seconds=30), wall=30, slots=1, queue="classic.q",
                  project="research") for n in range(200)]
    errors_seen, dropped = [], []

    def drop():
        try:
            dropped.append(retention.drop_old_detail(cluster, days=24, now=now, batch=2))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=drop)
    thread.start()
    for i in range(0, len(new), 10):
        with transaction.atomic():
            _store_records(cluster, new[i:i + 10])
    thread.join(timeout=120)
    assert not thread.is_alive() and not errors_seen, errors_seen
    cut = dt.datetime(2026, 3, 18, 12, tzinfo=UTC)
    assert dropped[0].cutoff == cut and dropped[0].tasks and dropped[0].batches > 2 and dropped[0].done
    assert not Task.objects.filter(active=False, ended_at__lt=cut).exists()
    assert AccountingRecord.objects.filter(job_number__gte=8000, job_number__lt=8020).count() == 200
    assert all_bills(teams, first=first, last=last, from_detail=False) == before
    april = bills.bill(teams=teams, period="month", first=dt.date(2026, 4, 1), last=dt.date(2026, 4, 30))
    assert april["not_tco_totals"]["records"] == 200 and april["not_tco_totals"]["wallclock_s"] == 6000


def waste_detail_sums() -> dict[tuple, list[int]]:
    """What the waste rollups must hold, computed here from the detail rows: per cluster, hour, campaign,
    end state, verdict (done tasks only), infrastructure (``core.failures.failure_of``'s kind, in
    Python: the rollups decide it in SQL) and earlier attempt, the tasks' (tasks, unpriced, cost units)
    then their records' (records, wall clock us, slot us) sums; only ended tasks of campaigns."""
    out: dict[tuple, list[int]] = {}

    def hour(moment):
        return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)

    def infrastructure(t: Task) -> bool:
        failure = failure_of(state=t.state, failed_code=t.failed_code, exit_status=t.exit_status,
                             runner=t.runner_record)
        return failure is not None and failure.kind == "infrastructure"

    for t in Task.objects.filter(active=False, campaign__isnull=False, started_at__isnull=False):
        key = (t.cluster_id, hour(t.started_at), t.campaign_id, t.state, t.verdict if t.state == "done" else "",
               infrastructure(t), False)
        row = out.setdefault(key, [0] * 6)
        row[0] += 1
        row[1] += int(t.cost_usd is None and any(getattr(t, b) > 0 for b in BUCKETS))
        row[2] += int(t.cost_usd * 10**8) if t.cost_usd is not None else 0
    starts: dict[int, list[int]] = {}
    for task_id, start_us in AccountingRecord.objects.filter(task__isnull=False).values_list("task_id", "start_us"):
        starts.setdefault(task_id, []).append(start_us)
    for r in AccountingRecord.objects.filter(started_at__isnull=False, task__isnull=False).select_related("task"):
        t = r.task
        if t.active or t.campaign_id is None:
            continue
        earlier = any(s > r.start_us for s in starts[t.id])
        key = (r.cluster_id, hour(r.started_at), t.campaign_id, t.state, t.verdict if t.state == "done" else "",
               infrastructure(t), earlier)
        row = out.setdefault(key, [0] * 6)
        wall = round(r.wallclock_s * 1_000_000)
        row[3] += 1
        row[4] += wall
        row[5] += wall * r.slots
    return {k: v for k, v in out.items() if any(v)}


def store_a_rerun(cluster: Cluster, *, later: dt.timedelta, wall: float, slots: int) -> None:
    """A rerun's record of the first ended campaign task with a record, starting ``later`` than that
    record, read after the task ended (as ingest stores a record of a known task): the task's first
    record becomes an earlier attempt, in the same transaction."""
    first = (AccountingRecord.objects.filter(task__active=False, task__campaign__isnull=False)
             .select_related("task").order_by("id").first())
    task = first.task
    rerun = parsed(task.job_number, task.task_number, submitted=first.submitted_at + dt.timedelta(seconds=9),
                   started=first.started_at + later, wall=wall, slots=slots, queue="agent.q",
                   ended=first.started_at + later + dt.timedelta(seconds=wall), project=task.project)
    with transaction.atomic():
        assert bulk.store_accounting_records(cluster, [rerun], {0: task.id}) == 1


def stored_waste() -> dict[tuple, list[int]]:
    out = {}
    for row in WasteRollup.objects.values_list(*WASTE_KEY, *WASTE_SUMS):
        if any(row[len(WASTE_KEY):]):
            out[(row[0], row[1].astimezone(UTC), *row[2:len(WASTE_KEY)])] = list(row[len(WASTE_KEY):])
    return out


def rounded(value):
    """``value`` (a waste view's result) with floats to the microsecond, for comparing two of them."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


@pytest.mark.parametrize("seed", budget.seeds([4, 5], check=4))
def test_waste_rollups_equal_the_detail_rows_and_the_waste_view_over_them_is_exact(seed, ops_users, tmp_path,
                                                                                  settings):
    history = build_history(random.Random(seed), tmp_path / "spool", ops_users)
    cluster = history["cluster"]
    store_a_rerun(cluster, later=dt.timedelta(hours=3), wall=123.25, slots=2)
    expected = waste_detail_sums()
    assert any(key[6] for key in expected) and any(key[3] == "failed" for key in expected)
    # Both kinds of failed task: the agent's own, and a metering proxy that never listened (the infrastructure's).
    assert {key[5] for key in expected if key[3] == "failed"} == {False, True}
    assert stored_waste() == expected
    assert rollups.waste_differences() == [] and rollups.differences() == []
    # The waste view from the rollups (and the active tasks' detail) equals the one from the detail
    # rows alone, in three zones (Kolkata's half hour: the detail rows), with another verdict setting.
    teams = history["teams"]
    for zone in ("UTC", "America/New_York", "Asia/Kolkata"):
        Cluster.objects.filter(pk=cluster.pk).update(time_zone=zone)
        for verdicts in (["fail", "failed"], ["ok", "bad"]):
            settings.TCO_FAILING_VERDICTS = verdicts
            for first, last, campaign in ((dt.date(2026, 3, 1), dt.date(2026, 3, 20), None),
                                          (dt.date(2026, 3, 3), dt.date(2026, 3, 5), None),
                                          (dt.date(2026, 3, 1), dt.date(2026, 3, 20), history["campaigns"][0].pk)):
                got = waste.waste(teams=teams, first=first, last=last, campaign=campaign, seats=False)
                want = waste.waste(teams=teams, first=first, last=last, campaign=campaign, seats=False,
                                   from_detail=True)
                assert rounded(got) == rounded(want)
    assert rounded(got)["totals"]["spent"]["tasks"] > 0
    rollups.rebuild_waste()
    assert stored_waste() == expected


def request_detail_sums() -> dict[tuple, list[int]]:
    """The request rollups computed here: the model requests of ended campaign tasks per cluster, hour
    of the task's start, campaign, provider and model."""
    out: dict[tuple, list[int]] = {}
    for r in ModelRequest.objects.select_related("task"):
        t = r.task
        if t.active or t.campaign_id is None or t.started_at is None:
            continue
        hour = t.started_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        out.setdefault((t.cluster_id, hour, t.campaign_id, r.provider, r.model), [0])[0] += 1
    return out


def test_request_rollups_equal_the_request_rows_and_name_the_focus_publishers(ops_users, tmp_path):
    from dashboards.billing import focus

    history = build_history(random.Random(6), tmp_path / "spool", ops_users)
    expected = request_detail_sums()
    assert expected
    stored = {(r[0], r[1].astimezone(UTC), *r[2:5]): [r[5]] for r in RequestRollup.objects.values_list(
        *REQUEST_KEY, "requests") if r[5]}
    assert stored == expected
    assert rollups.kind_differences("requests") == []
    # The export's publishers from the rollups (whole hours) equal those from the request rows.
    window = focus.window(first=dt.date(2026, 3, 1), last=dt.date(2026, 3, 20))
    cluster = history["cluster"]
    begin, end = window.bounds(dt.timezone.utc)
    ids = {c.pk for c in history["campaigns"]}
    from_rows = focus._publishers(cluster, begin + dt.timedelta(seconds=1), end, ids)
    assert focus._publishers(cluster, begin, end, ids) == from_rows and set(from_rows.values()) == {"anthropic"}
    rollups.rebuild_requests()
    assert rollups.kind_differences("requests") == []
