"""The day grain of the usage and waste rollups (issue 26): equal to the detail rows and to the hour grain.

Random usage goes in through tco's ingest paths (``tests/db/test_rollups.py``'s
history: accounting ingest, runner records, lost tasks, jobs tco did not
launch, a rerun); the day rows are compared with sums computed here from the
detail rows per UTC day, and with the hour rows summed per day. Bills,
budgets' spend, ``/api/usage/`` and the waste view read whole UTC days from
the day rows: they must equal the same figures from the detail rows alone,
to the cent and the microsecond, in UTC, in New York (a DST change inside the
range: local midnights at 04:00 and 05:00 UTC) and with ranges that start and
end inside a day or an hour.
"""
from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import pytest
from django.db import transaction

from dashboards.billing import bills, waste
from dashboards.core import rollups
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest.accounting import _store_records
from dashboards.models import AccountingRecord, Cluster, Task, Team, UsageRollup, WasteRollup
from dashboards.rollup_models import (DAY_KEY, SUMS, WASTE_DAY_KEY, WASTE_SUMS, UsageDayRollup,
                                      WasteDayRollup)
from tests.db.test_rollups import (START, all_bills, build_history, detail_sums, parsed, rounded,
                                   waste_detail_sums)
from tests.support import budget
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc


def by_day(sums: dict[tuple, list[int]]) -> dict[tuple, list[int]]:
    """Hour-keyed sums (cluster, hour, ...) folded into UTC days, here in Python."""
    out: dict[tuple, list[int]] = {}
    for key, values in sums.items():
        day = key[1].astimezone(UTC).replace(hour=0)
        row = out.setdefault((key[0], day, *key[2:]), [0] * len(values))
        for i, v in enumerate(values):
            row[i] += v
    return {k: v for k, v in out.items() if any(v)}


def stored_days(model, key, sums) -> dict[tuple, list[int]]:
    out = {}
    for row in model.objects.values_list(*key, *sums):
        if any(row[len(key):]):
            out[(row[0], row[1].astimezone(UTC), *row[2:len(key)])] = list(row[len(key):])
    return out


@pytest.mark.parametrize("seed", budget.seeds([21, 22, 23], check=1))
def test_day_rows_equal_the_detail_rows_and_the_hour_rows(seed, ops_users, tmp_path):
    history = build_history(random.Random(seed), tmp_path / "spool", ops_users, days=16)
    expected = by_day(detail_sums())
    assert len(expected) > 16 and stored_days(UsageDayRollup, DAY_KEY, SUMS) == expected
    assert by_day(waste_detail_sums()) == stored_days(WasteDayRollup, WASTE_DAY_KEY, WASTE_SUMS)
    assert rollups.day_differences("usage") == [] and rollups.day_differences("waste") == []
    # A rebuild from the hour rows, and one from the detail rows (which makes the days again too), agree.
    assert rollups.rebuild_days("usage") == len(expected)
    rollups.rebuild(cluster_id=history["cluster"].pk, since=START + dt.timedelta(days=3, hours=7))
    rollups.rebuild_waste()
    assert stored_days(UsageDayRollup, DAY_KEY, SUMS) == expected
    assert by_day(waste_detail_sums()) == stored_days(WasteDayRollup, WASTE_DAY_KEY, WASTE_SUMS)


@pytest.mark.parametrize("seed", budget.seeds([24, 25], check=1))
def test_bills_budgets_usage_and_waste_over_the_day_grain_equal_the_detail_rows(seed, ops_users, tmp_path, settings):
    history = build_history(random.Random(seed), tmp_path / "spool", ops_users, days=20)
    teams, campaign = history["teams"], history["campaigns"][0].pk
    cluster = history["cluster"]
    for zone in ("UTC", "America/New_York"):
        Cluster.objects.filter(pk=cluster.pk).update(time_zone=zone)
        # Whole months, and ranges that start and end mid-week (partial weeks at either edge).
        for first, last in ((dt.date(2026, 3, 1), dt.date(2026, 3, 31)), (dt.date(2026, 3, 4), dt.date(2026, 3, 17))):
            assert all_bills(teams, first=first, last=last, from_detail=False, campaign=campaign) == \
                all_bills(teams, first=first, last=last, from_detail=True, campaign=campaign)
            for verdicts in (["fail", "failed"], ["ok"]):
                settings.TCO_FAILING_VERDICTS = verdicts
                got = waste.waste(teams=teams, first=first, last=last, seats=False)
                assert rounded(got) == rounded(waste.waste(teams=teams, first=first, last=last, seats=False,
                                                           from_detail=True))
                assert got["totals"]["spent"]["tasks"] > 0
    Cluster.objects.filter(pk=cluster.pk).update(time_zone="UTC")
    # Budgets: a team's spend per local day of another zone (days cut at 05:00 / 04:00 UTC).
    zone = dt.timezone(dt.timedelta(hours=-5))
    begin, end = dt.datetime(2026, 3, 1, 5, tzinfo=UTC), dt.datetime(2026, 3, 25, 5, tzinfo=UTC)
    spend = bills.teams_spend_between(teams, begin, end, days_tz=zone)
    for team in teams:
        tasks = Task.objects.filter(campaign__team=team, started_at__gte=begin, started_at__lt=end)
        assert spend[team.project]["spent_usd"] == sum((t.cost_usd or Decimal(0)) for t in tasks)
        daily: dict[dt.date, Decimal] = {}
        for t in tasks:
            daily[t.started_at.astimezone(zone).date()] = daily.get(t.started_at.astimezone(zone).date(),
                                                                    Decimal(0)) + (t.cost_usd or Decimal(0))
        assert {d: v for d, v in spend[team.project]["daily"].items() if v} == {d: v for d, v in daily.items() if v}
    # /api/usage/: ranges that start and end inside a day and inside an hour, and whole days.
    for since, until in ((START + dt.timedelta(hours=7, minutes=13, seconds=2), START + dt.timedelta(days=9, hours=3)),
                         (START + dt.timedelta(hours=22), START + dt.timedelta(days=14, hours=1, minutes=30)),
                         (START, START + dt.timedelta(days=21))):
        got = bills.usage_by_team(ops_users["admin"], since=since, until=until)
        want = bills.usage_by_team(ops_users["admin"], since=since, until=until, from_detail=True)
        assert rounded(got) == rounded(want) and got["teams"]


def test_whole_days_come_from_the_day_rows_and_the_edges_from_the_hours(ops_users):
    """Which grain serves which hour: a day row changed by hand moves a bill that covers its whole
    day and not one that covers part of it; an hour row inside that day moves only the latter."""
    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], job_number=7300)
    day = dt.datetime(2026, 5, 5, tzinfo=UTC)  # a Tuesday
    for n, hour in enumerate((1, 13, 23)):
        at = day + dt.timedelta(hours=hour, minutes=20)
        task = Task.objects.create(cluster=cluster, campaign=campaign, job_number=7300, task_number=n + 1,
                                   is_array=True, state="finishing", active=True, submitted_at=at, started_at=at,
                                   gone_at=at)
        with transaction.atomic():
            _store_records(cluster, [parsed(7300, n + 1, submitted=at, started=at, ended=at + dt.timedelta(seconds=60),
                                            wall=60.5, slots=2, queue="agent.q", project="research")])
        with rollups.tasks_rolled([task.pk]):
            Task.objects.filter(pk=task.pk).update(cost_usd=Decimal("0.10000001"))
    (row,) = UsageDayRollup.objects.all()
    assert (row.day, row.tasks, row.records, row.cost_units, row.wallclock_us, row.slot_us) == (
        day, 3, 3, 30000003, 181_500_000, 363_000_000)
    week = {"teams": [research], "period": "week", "first": dt.date(2026, 5, 4), "last": dt.date(2026, 5, 10)}
    assert bills.bill(**week)["totals"]["cost_usd"] == Decimal("0.30000003")
    UsageDayRollup.objects.filter(pk=row.pk).update(cost_units=30000004)
    assert bills.bill(**week)["totals"]["cost_usd"] == Decimal("0.30000004")  # the day row served the week
    UsageRollup.objects.filter(hour=day + dt.timedelta(hours=13)).update(cost_units=99)
    assert bills.bill(**week)["totals"]["cost_usd"] == Decimal("0.30000004")  # its hours were not read
    # In New York the week's edges are hours (Monday 04:00 UTC on): the 13:00 hour is inside a whole day.
    Cluster.objects.filter(pk=cluster.pk).update(time_zone="America/New_York")
    assert bills.bill(**week)["totals"]["cost_usd"] == Decimal("0.30000004")
    # A range that covers only part of the day reads its hours.
    usage = bills.usage_by_team(ops_users["admin"], since=day + dt.timedelta(hours=12), until=day + dt.timedelta(hours=24))
    assert [r["cost_usd"] for r in usage["teams"]] == [Decimal("0.10000001") + Decimal("0.00000099")]
    assert rollups.day_differences("usage") != []  # the hand edits show
    rollups.rebuild()
    assert rollups.day_differences("usage") == [] and bills.bill(**week)["totals"]["cost_usd"] == Decimal("0.30000003")
    assert WasteRollup.objects.exists() and rollups.day_differences("waste") == []


def test_records_of_a_day_reread_are_counted_once_in_its_day_row(ops_users):
    cluster = cluster_get_default()
    at = dt.datetime(2026, 6, 1, 23, 59, 59, tzinfo=UTC)
    records = [parsed(9100 + n, 0, submitted=at, started=at + dt.timedelta(seconds=n), wall=1.000001 * (n + 1),
                      ended=at + dt.timedelta(seconds=2 * n + 1), slots=3, queue="classic.q", project="physics")
               for n in range(3)]
    for _ in range(2):
        with transaction.atomic():
            _store_records(cluster, records)
    assert AccountingRecord.objects.count() == 3
    days = {r.day.date(): (r.records, r.wallclock_us, r.slot_us) for r in UsageDayRollup.objects.all()}
    assert days == {dt.date(2026, 6, 1): (1, 1_000_001, 3_000_003), dt.date(2026, 6, 2): (2, 5_000_005, 15_000_015)}
