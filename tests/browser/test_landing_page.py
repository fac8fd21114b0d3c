"""The landing page in Debian's Chromium at 1400x900 and 390x844: the tiles come first, each figure
equal to what the database counts for the user, with the user's campaigns in the first screen and no
sideways scroll. Screenshots: var/test-output/uxb/landing-*.png."""
from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from dashboards.models import Campaign, Task
from tests.support.browser import drawn_box, inside, shot, signed_in, wait_for
from tests.support.landing import landing_scene

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

DESKTOP = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}


def _counted(projects: list[str]) -> dict[str, object]:
    """The tiles' figures as plain queries over the tasks of ``projects``' campaigns count them now (a
    team member sees its campaigns' tasks, not other jobs under its project)."""
    now = timezone.now()
    tasks = Task.objects.filter(campaign__team__project__in=projects)
    active = tasks.filter(active=True)
    hour = tasks.filter(active=False, ended_at__gte=now - dt.timedelta(hours=1))
    midnight = now.astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    spent = (Task.objects.filter(campaign__team__project__in=projects, started_at__gte=midnight)
             .aggregate(s=Sum("cost_usd"))["s"] or Decimal(0))
    oldest = active.filter(state="pending").order_by("submitted_at").first()
    wait = (now - oldest.submitted_at).total_seconds() if oldest else 0
    return {"running": str(active.filter(state="running").count()),
            # The amber line is 10 min, red 1 h (dashboards.web.landing); a second either side of a line is
            # not asserted (the page was read a moment before this count).
            "longest": "red" if wait >= 3600 else "amber" if wait >= 600 else "ok",
            "waiting": str(active.filter(state__in=("pending", "held")).count()),
            "failed": str(hour.filter(state__in=("failed", "lost")).count()),
            "spend": spent.normalize()}


def _shown(page) -> dict[str, object]:
    numbers = {key: page.get_attribute(f'#tiles [data-tile="{key}"] .tile-value', "data-number")
               for key in ("running", "waiting", "failed")}
    numbers["longest"] = page.get_attribute('#tiles [data-tile="longest"]', "data-level")
    if page.locator('#tiles [data-tile="spend"]').count():
        numbers["spend"] = Decimal(page.get_attribute('#tiles [data-tile="spend"] .tile-value', "data-number")).normalize()
    return numbers


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1400x900", "390x844"])
def test_the_landing_page_answers_at_a_glance(ops_stack, browser, ops_logins, viewport):
    landing_scene(ops_logins)
    mine = Campaign.objects.get(name="land-mine")
    for user in ("lead", "launcher"):
        with signed_in(browser, ops_stack, user, viewport=viewport) as page:
            page.goto(ops_stack.url + "/")
            page.wait_for_selector("#tiles .tile")

            # The poll of the real dev cluster runs beside the test: read the page and the database
            # again until both are of the same moment.
            seen = []

            def same() -> bool:
                expected = _counted(["research"])
                shown = _shown(page)
                seen[:] = [shown, expected]
                if shown == {k: v for k, v in expected.items() if k in shown}:
                    return True
                page.reload()
                page.wait_for_selector("#tiles .tile")
                return False
            try:
                wait_for(same, 60, f"{user}'s tiles to equal the database's counts")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: shown {seen[0]}, counted {seen[1]}") from None
            shot(page, f"landing-{user}-{viewport['width']}")
            assert ("spend" in _shown(page)) == (user == "lead")  # spend is the bill readers'
            # Each tile is a link with its figure and unit; a level past "ok" is said in words too.
            longest = page.locator('#tiles [data-tile="longest"]')
            level = longest.get_attribute("data-level")
            words = longest.inner_text().lower()
            assert ("warning" in words) == (level == "amber") and ("alert" in words) == (level == "red")
            if level != "ok":
                assert longest.get_attribute("href").startswith("/tasks/")
            assert page.text_content('#tiles [data-tile="running"] .tile-value').strip().endswith(("agent", "agents"))
            # At a glance: the tiles and the campaigns within the first screen, nothing wider than it.
            for key in ("running", "waiting", "longest", "failed"):
                inside(page, f'#tiles [data-tile="{key}"]', viewport["width"])
            assert drawn_box(page, "#tiles")["y"] < viewport["height"] / 3
            heading = page.locator("#my-campaigns h2").bounding_box()
            assert heading["y"] < viewport["height"], f"the campaigns start at {heading['y']:.0f} px"
            width = page.evaluate("document.scrollingElement.scrollWidth")
            assert width <= viewport["width"], f"the page scrolls sideways: {width} px"
            if user == "launcher":
                row = page.locator(f'#my-campaigns-table tr[data-campaign="{mine.pk}"]')
                assert row.count() == 1 and "land-mine" in row.inner_text()
                inside(page, f'#my-campaigns-table tr[data-campaign="{mine.pk}"] td:last-child', viewport["width"])
            # The toggle: my teams' campaigns, the lead's own among them.
            page.click('.scope-toggle a[data-scope="teams"]')
            page.wait_for_selector('#my-campaigns-table tr[data-campaign]')
            shown = set(page.eval_on_selector_all("#my-campaigns-table tr[data-campaign]",
                                                  "rows => rows.map(r => r.dataset.campaign)"))
            assert shown == {str(c.pk) for c in Campaign.objects.filter(team__project="research")}


def test_the_tiles_follow_the_live_queue_without_a_reload(ops_stack, browser, ops_logins):
    """Done-means "live": a campaign that starts while the page is open changes the running tile
    through the page's socket (live.js's "tco:live" event fetches the tiles again), well before the
    30 s fallback read, and the page is never reloaded."""
    from dashboards.launch.service import LaunchRequest, launch
    from dashboards.models import AgentDefinition, Team
    from tests.support.cluster import qdel_quietly

    with signed_in(browser, ops_stack, "launcher", viewport=DESKTOP) as page:
        page.goto(ops_stack.url + "/")
        page.wait_for_selector("#tiles .tile")
        page.wait_for_function("document.getElementById('live').classList.contains('on')", timeout=15000)
        page.evaluate("window.tcoNotReloaded = true")
        before = int(_shown(page)["running"])
        events = page.evaluate_handle("""() => { const seen = []; document.addEventListener('tco:live',
            ev => seen.push(ev.detail.kind)); return seen; }""")
        campaign = launch(user=ops_logins["launcher"], request=LaunchRequest(
            team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
            name="tiles-live", inputs=[{"task": n, "duration_s": 40.0} for n in range(1, 4)])).campaign
        try:
            row = f'#my-campaigns-table tr[data-campaign="{campaign.pk}"]'
            wait_for(lambda: page.locator(row).count() == 1, 25,
                     "the new campaign in the launcher's campaigns without a reload")
            wait_for(lambda: int(_shown(page)["running"]) > before or
                     Task.objects.filter(campaign=campaign, state="running").count() == 0, 25,
                     "the running tile to count the new campaign's agents")
            assert page.evaluate("window.tcoNotReloaded === true")
            assert "queue.snapshot" in events.json_value()
            shot(page, "landing-live")
        finally:
            qdel_quietly(Campaign.objects.get(pk=campaign.pk).job_number)


def test_a_push_during_a_tiles_read_is_read_after_it_not_dropped(ops_stack, browser, ops_logins):
    """A queue push that arrives while the tiles are being read (landing.js's fetch of /landing) is read
    when that read ends: the old page dropped it, and the tiles kept the older figures until the 30 s
    fallback read (seen by a helper: tiles behind the banner). Here each read of /landing is held 4 s in
    the page; a push at 0 s starts a read (0.25 s later), a push at 0.5 s comes due while it is held:
    two reads must follow within 12 s, well before the fallback, and the second begins 2 s (MIN_GAP_MS)
    after the first ended, not at once: a slow server is not asked again back to back."""
    with signed_in(browser, ops_stack, "launcher", viewport=DESKTOP) as page:
        page.goto(ops_stack.url + "/")
        page.wait_for_selector("#tiles .tile")
        page.evaluate("""() => {
            // Only this test's pushes reach landing.js: the poll's own pushes are stopped first (a
            // capturing listener at the document runs before landing.js's).
            document.addEventListener('tco:live', ev => { if (!ev.detail.test) { ev.stopImmediatePropagation(); } }, true);
            window.landingReads = [];
            const fetchNow = window.fetch;
            window.fetch = (url, options) => {
                if (!String(url).startsWith('/landing')) { return fetchNow(url, options); }
                window.landingReads.push(Date.now());
                return new Promise(done => setTimeout(done, 4000)).then(() => fetchNow(url, options));
            };
            const push = () => document.dispatchEvent(new CustomEvent('tco:live', {detail: {kind: 'queue.snapshot', test: true}}));
            push();
            setTimeout(push, 500);
        }""")
        wait_for(lambda: page.evaluate("window.landingReads.length") >= 2, 12,
                 "a second read of the tiles after the one a push found running")
        reads = page.evaluate("window.landingReads")
        # 4 s held + 2 s gap from its end (counted from its start, the gap had passed: 0.25 s after the end).
        assert reads[1] - reads[0] >= 5800, f"the second read began {reads[1] - reads[0]} ms after the first"
