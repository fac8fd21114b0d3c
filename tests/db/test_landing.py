"""The landing page's tiles and campaign table (dashboards.web.landing) against figures counted here
from the database, per user's scope; thresholds; mine / my teams / all."""
from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from dashboards.models import Campaign, Task
from tests.support.landing import landing_scene

pytestmark = pytest.mark.django_db


def _tiles(user, now):
    from dashboards.web.landing import landing_tiles

    return {t["key"]: t for t in landing_tiles(user, seat_resource="anthropic_api", now=now)}


def _expected(projects: list[str], now: dt.datetime) -> dict:
    """The tiles' figures, counted with plain queries over the tasks of ``projects``."""
    tasks = Task.objects.filter(project__in=projects)
    active = tasks.filter(active=True)
    oldest = active.filter(state="pending").order_by("submitted_at").first()
    hour = tasks.filter(active=False, ended_at__gte=now - dt.timedelta(hours=1))
    return {"running": active.filter(state="running").count(),
            "waiting": active.filter(state__in=("pending", "held")).count(),
            "longest": (now - oldest.submitted_at).total_seconds() if oldest else 0,
            "failed": hour.filter(state="failed").count(), "ended": hour.count()}


def test_the_tiles_count_what_each_user_may_see_with_units_and_levels(ops_users):
    now = timezone.now()
    landing_scene(ops_users, now=now)
    admin, launcher = _tiles(ops_users["admin"], now), _tiles(ops_users["launcher"], now)
    every, research = _expected(["research", "engineering"], now), _expected(["research"], now)
    assert (admin["running"]["number"], launcher["running"]["number"]) == (every["running"], research["running"]) == (5, 2)
    assert launcher["running"]["value"] == "2 agents" and launcher["running"]["detail"] == "on 2 hosts"
    assert launcher["waiting"]["number"] == research["waiting"] == 2
    assert launcher["waiting"]["detail"] == "1 pending, 1 held"
    assert admin["waiting"]["href"] == "/ops/triage/" and launcher["waiting"]["href"] == "#campaigns"
    # Pending for 20 minutes: past the 10-minute amber line, not the hour's red; the tile opens that task.
    longest = launcher["longest"]
    assert longest["number"] == pytest.approx(research["longest"]) and longest["level"] == "amber"
    assert longest["value"] == "20 min" and longest["detail"].endswith("1 pending longer than 10 min")
    pending = Task.objects.get(project="research", state="pending")
    assert longest["href"] == f"/tasks/{pending.pk}/" and f"task {pending.task_id};" in longest["detail"]
    # One failed of two ended in the last hour: amber (red needs 3 and a quarter of those ended).
    failed = launcher["failed"]
    assert (failed["number"], failed["value"], failed["level"]) == (research["failed"], "1 task", "amber")
    assert failed["detail"] == f"of {research['ended']} tasks that ended"
    mine = Campaign.objects.get(name="land-mine")
    assert failed["href"] == f"/campaigns/{mine.pk}/?state=failed"
    # The cluster's figures from the poll: 6 of 12 slots, 6 of 96 seats, sge-exec3 unreachable.
    assert launcher["slots"]["value"] == "6 of 12 slots" and launcher["slots"]["detail"] == "50% of the cluster's slots"
    assert launcher["seats"]["value"] == "6 of 96 seats"
    hosts = launcher["hosts"]
    assert (hosts["value"], hosts["level"], hosts["detail"]) == ("1 of 3 hosts", "amber", "sge-exec3 unreachable")
    assert launcher["mine"]["value"] == "1 campaign" and launcher["mine"]["detail"] == "1 unfinished on my teams"
    assert admin["mine"]["value"] == "0 campaigns" and admin["mine"]["detail"] == "2 unfinished on every team"


def test_spend_today_is_for_bill_readers_against_the_budget_most_used(ops_users):
    now = timezone.now()
    landing_scene(ops_users, now=now)
    midnight = now.astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    spent = (Task.objects.filter(campaign__team__project="research", started_at__gte=midnight)
             .aggregate(s=Sum("cost_usd"))["s"] or Decimal(0))
    tile = _tiles(ops_users["lead"], now)["spend"]
    assert tile["number"] == spent
    assert tile["value"] == f"${spent.quantize(Decimal('0.01'))} (USD)"
    fraction = spent / Decimal("1.00")
    assert tile["detail"] == f"research: ${spent.quantize(Decimal('0.01'))} of its $1.00 day budget ({fraction:.0%})"
    assert tile["level"] == ("red" if fraction >= 1 else "amber" if fraction >= Decimal("0.5") else "ok")
    assert tile["href"] == "/ops/bills/?period=day"
    assert "spend" not in _tiles(ops_users["launcher"], now) and "spend" not in _tiles(ops_users["viewer"], now)


def test_the_campaign_table_is_mine_my_teams_or_all_filtered_and_sorted(ops_users):
    from dashboards.web.landing import my_campaigns

    landing_scene(ops_users)

    def names(user, **kwargs):
        return [r["name"] for r in my_campaigns(user, **kwargs)["rows"]]
    assert names(ops_users["launcher"]) == ["land-mine"]  # mine by default
    assert sorted(names(ops_users["viewer"])) == ["land-lead", "land-mine"]  # launched none: my teams'
    assert sorted(names(ops_users["launcher"], scope="all")) == ["land-mine"]  # "all" is the admins'
    assert sorted(names(ops_users["admin"], scope="all")) == ["land-eng", "land-lead", "land-mine"]
    assert names(ops_users["viewer"], scope="teams", sort="cost") == ["land-mine", "land-lead"]
    assert names(ops_users["viewer"], scope="teams", sort="cost", descending=False) == ["land-lead", "land-mine"]
    assert names(ops_users["viewer"], scope="teams", status="unfinished") == ["land-mine"]
    assert names(ops_users["viewer"], scope="teams", q="LEAD") == ["land-lead"]
    row = my_campaigns(ops_users["launcher"])["rows"][0]
    done = Task.objects.filter(campaign__name="land-mine", active=False).count()
    assert (row["ended"], row["failed"], row["running"], row["waiting"]) == (done, 1, 2, 2)
    assert row["cost_usd"] == Task.objects.filter(campaign__name="land-mine").aggregate(s=Sum("cost_usd"))["s"]
    assert row["progress_pct"] == round(100 * done / 6)


def test_the_landing_page_shows_the_tiles_first_and_the_cluster_details_below(client, ops_users):
    landing_scene(ops_users)
    client.force_login(ops_users["launcher"])
    html = client.get("/").content.decode()
    order = [html.index(marker) for marker in ('id="tiles"', 'id="my-campaigns"', 'id="campaigns"',
                                               'id="cluster-card"', 'id="hosts-card"')]
    assert order == sorted(order)
    tile = re.search(r'data-tile="longest" data-level="amber">.*?</a>', html, re.S).group(0)
    assert "warning" in tile and "20 min" in tile
    assert re.search(r'data-scope="mine" aria-current="true"', html)
    assert 'id="other-jobs-none"' in html


def test_the_fragment_the_page_refreshes_has_the_same_tiles_and_rows(client, ops_users):
    landing_scene(ops_users)
    client.force_login(ops_users["viewer"])
    html = client.get("/landing?scope=teams&sort=cost").content.decode()
    assert html.count('class="tile ') == len(re.findall(r'data-tile="', client.get("/").content.decode()))
    assert re.findall(r'<tr data-campaign="(\d+)"', html) == [
        str(Campaign.objects.get(name=n).pk) for n in ("land-mine", "land-lead")]
    client.logout()
    assert client.get("/landing").status_code == 302


def test_the_audience_tiles_travel_in_the_queue_snapshot_and_the_page_reads_them_there(
        client, ops_users, memory_live_store, django_assert_max_num_queries):
    """The live producer builds an audience's tiles once (issue 22: no aggregate over the tasks per GET):
    the queue snapshot's tiles equal the figures counted here, and a page GET shows the snapshot's
    tiles, not a read of its own (a tile changed in the store shows on the page)."""
    import json

    from dashboards.core import live_bus
    from dashboards.core.scope import scope_of
    from dashboards.live import publish, snapshots

    now = timezone.now()
    landing_scene(ops_users, now=now)
    launcher = ops_users["launcher"]
    view = snapshots.queue_view(scope_of(launcher), 1)
    data = snapshots.build(view)
    tiles = {t["key"]: t for t in data["tiles"]}
    research = _expected(["research"], now)
    assert (tiles["running"]["number"], tiles["waiting"]["number"], tiles["failed"]["number"]) == (
        research["running"], research["waiting"], research["failed"])
    # What the page shows comes from the stored snapshot: mark one figure there and find it on the page.
    client.force_login(launcher)
    client.get("/")                       # registers the view (the page's socket follows it)
    publish.publish_pass()                # the producer's pass builds and stores it
    raw = memory_live_store.snaps.get(view.key)
    assert raw is not None
    record = live_bus.Record.decode(raw)
    message = json.loads(record.body)
    for tile in message["data"]["tiles"]:
        if tile["key"] == "running":
            tile["value"] = "4242 agents"
    memory_live_store.snaps[view.key] = live_bus.Record(record.seq, record.gen, record.epoch, record.observed_at,
                                                        json.dumps(message).encode()).encode()
    assert "4242 agents" in client.get("/").content.decode()
    assert "4242 agents" in client.get("/landing").content.decode()
