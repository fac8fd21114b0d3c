"""Page notices expire: a "campaign finished" notice shows on a few pages, for a while, and not after
its campaign's page was opened (dashboards.launch.notices)."""
from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from dashboards.models import Campaign, Team
from tests.support.history import make_campaign

pytestmark = pytest.mark.django_db


def _finished(ops_users, name: str, minutes_ago: float) -> Campaign:
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], name=name)
    Campaign.objects.filter(pk=campaign.pk).update(finished_at=timezone.now() - dt.timedelta(minutes=minutes_ago))
    return Campaign.objects.get(pk=campaign.pk)


def _notice(client, url: str = "/ops/agents/") -> str:
    html = client.get(url).content.decode()
    return html.split('id="campaign-notices"', 1)[1].split("</ul>", 1)[0] if 'id="campaign-notices"' in html else ""


def test_a_finished_notice_shows_on_a_few_pages_then_expires(client, ops_users, settings):
    settings.TCO_NOTICE_PAGES = 3
    campaign = _finished(ops_users, "expiring", 2)
    client.force_login(ops_users["launcher"])
    shown = [_notice(client) for _ in range(4)]
    assert all(f"expiring (#{campaign.pk})" in n for n in shown[:3]) and shown[3] == ""
    # It links the campaign's live page, with the finish time and its zone.
    assert f'href="/campaigns/{campaign.pk}/"' in shown[0] and " UTC" in shown[0]


def test_opening_the_campaigns_page_retires_its_notice_but_not_the_others(client, ops_users):
    first = _finished(ops_users, "first", 5)
    second = _finished(ops_users, "second", 3)
    client.force_login(ops_users["launcher"])
    assert f"second (#{second.pk})" in _notice(client)
    client.get(f"/campaigns/{second.pk}/")
    notice = _notice(client)
    assert f"second (#{second.pk})" not in notice and f"first (#{first.pk})" in notice


def test_a_notice_is_not_shown_once_its_finish_is_older_than_the_window(client, ops_users, settings):
    settings.TCO_NOTICE_MINUTES = 10
    _finished(ops_users, "old", 11)
    recent = _finished(ops_users, "recent", 9)
    client.force_login(ops_users["launcher"])
    notice = _notice(client)
    assert "old (#" not in notice and f"recent (#{recent.pk})" in notice


def test_a_finished_notice_reaches_those_who_may_see_the_campaign_and_no_one_else(client, ops_users):
    """The launcher, its team's members and admins are told; another team's user and a user on no
    team are not (the page would name a campaign they may not open), nor a launcher who left the team."""
    from dashboards.models import Membership

    campaign = _finished(ops_users, "research-eval", 2)
    expected = f"research-eval (#{campaign.pk})"
    for who in ("launcher", "viewer", "lead", "admin"):
        client.force_login(ops_users[who])
        assert expected in _notice(client), who
    for who in ("other", "nobody"):
        client.force_login(ops_users[who])
        assert _notice(client) == "", who
    # The engineering launcher's own campaign is theirs to be told about, not research's members'.
    theirs = make_campaign(team=Team.objects.get(project="engineering"), user=ops_users["other"], name="eng-eval")
    Campaign.objects.filter(pk=theirs.pk).update(finished_at=timezone.now())
    client.force_login(ops_users["other"])
    assert f"eng-eval (#{theirs.pk})" in _notice(client) and "research-eval" not in _notice(client)
    client.force_login(ops_users["viewer"])
    assert "eng-eval" not in _notice(client)
    # A launcher removed from the team is no longer told about the team's campaign, their own included.
    Membership.objects.filter(user=ops_users["launcher"]).delete()
    ops_users["launcher"].groups.clear()  # the team's group (membership_set puts members in it)
    client.force_login(ops_users["launcher"])
    assert _notice(client) == ""


def _expires_in(html: str, notice: str) -> float:
    tag = html.split(f'data-notice="{notice}"', 1)[1].split(">", 1)[0]
    return float(tag.split('data-expires-in="', 1)[1].split('"', 1)[0])


def test_a_notice_says_when_it_expires_so_a_page_left_open_drops_it(client, ops_users, settings):
    """A live page is never reloaded: the notice carries the seconds it has left (notices.js removes it
    then), where it stayed on screen long after it was stale. The anomaly alerts' notices likewise."""
    from dashboards.alerts.notices import alert_expires_in
    from dashboards.models import AnomalyAlert

    settings.TCO_NOTICE_MINUTES = 10
    older = _finished(ops_users, "older", 7)
    latest = _finished(ops_users, "latest", 4)
    client.force_login(ops_users["launcher"])
    html = client.get("/ops/agents/").content.decode()
    # 10 min after the finish: 6 min left for the latest (shown), 3 min for the older one (listed).
    assert _expires_in(html, f"campaign-finished-{latest.pk}-{int(latest.finished_at.timestamp())}") == \
        pytest.approx(360, abs=3)
    more = html.split('class="more-notice"', 1)[1].split(">", 1)[0]
    assert float(more.split('data-expires-in="', 1)[1].split('"', 1)[0]) == pytest.approx(180, abs=3)
    assert f"older (#{older.pk})" in html.split('class="more-notice"', 1)[1].split("</span>", 1)[0]
    # An anomaly alert shown to its team's lead: TCO_ALERT_NOTICE_HOURS after it.
    settings.TCO_ALERT_NOTICE_HOURS = 2
    half_hour_ago = timezone.now() - dt.timedelta(minutes=30)
    alert = AnomalyAlert.objects.create(team=Team.objects.get(project="research"), kind="budget_burn",
                                        key="t", title="Budget spent early", text="x", starts_at=half_hour_ago)
    AnomalyAlert.objects.filter(pk=alert.pk).update(at=half_hour_ago)   # ``at`` is set on create
    alert.refresh_from_db()
    client.force_login(ops_users["lead"])
    html = client.get("/ops/agents/").content.decode()
    assert _expires_in(html, f"anomaly-{alert.pk}") == pytest.approx(5400, abs=3) == alert_expires_in(alert)


def test_a_live_page_reading_itself_again_does_not_use_up_a_notices_pages(client, ops_users, settings):
    """The triage page reads itself again in the background at each change (triage_live.js): those reads
    used up the notice's pages while the admin looked at one."""
    settings.TCO_NOTICE_PAGES = 2
    campaign = _finished(ops_users, "watched", 1)
    client.force_login(ops_users["admin"])
    assert f"watched (#{campaign.pk})" in _notice(client, "/ops/triage/")
    for _ in range(5):
        client.get("/ops/triage/", headers={"X-TCO-Live-Read": "1"})
    assert f"watched (#{campaign.pk})" in _notice(client)
    assert _notice(client) == ""
