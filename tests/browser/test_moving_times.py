"""Issue 24, the users' day, in Debian's Chromium on the live stack and the real dev cluster.

Relative times move between two pushes: "0 s ago" written when a snapshot came stayed "0 s ago" on a
quiet campaign for minutes. Each page's clock (static/js/clock.js) writes them again every second from
their instant. Here the page's clock is Playwright's: paused while the page loads, then moved on ten
minutes with no push and no re-read (the triage page's and the landing tiles' background reads are
refused), and every relative time must read what Python's own words say for its instant and that
moment: the triage page (the time a tco hold was put on, how long each job and each group has waited),
the task page (the same hold among the reasons), the queue page (the longest pending task, the last
poll). The JavaScript words are also compared with Python's over their rounding edges.

And the triage page at 390 px: every cell of a job keeps its own line with its label, the Team cell of
a job submitted without a project says so (it was an empty cell 3 px high, its label over the next one).
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import uuid

import pytest
from django.db.models import Min
from django.utils import timezone

from dashboards.models import AuditEntry, Cluster, ControlRequest, Task, Team
from dashboards.launch.forecast_record import span_text
from dashboards.templatetags.ops import seconds as hms_text
from schedulers.durations import duration_text
from tests.helpers import wait_until
from tests.support.browser import shot, signed_in
from tests.support.cluster import SGE_ENV, qdel_quietly

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

DESKTOP = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}
#: How far the page's clock is moved on, with no push: ten minutes and a second (one tick after the jump).
MOVED_S = 601


def _qsub(*args: str) -> int:
    out = subprocess.run(["qsub", "-terse", "-b", "y", "-o", "/dev/null", "-e", "/dev/null", *args, "/bin/sleep", "5"],
                         capture_output=True, text=True, env=SGE_ENV, check=True)
    return int(out.stdout.strip().split(".")[0])


def _epoch(moment: dt.datetime) -> float:
    return moment.timestamp()


def _words(fmt: str, seconds: float) -> set[str]:
    """The words a page may show for ``seconds`` in format ``fmt``: Python's own (durations.duration_text,
    the ops ``seconds`` filter, core.clock's "ago"), for ``seconds`` give or take 2 ms (the page reads its
    instant with three decimals)."""
    out = set()
    for s in (seconds - 0.002, seconds, seconds + 0.002):
        if fmt == "ago":
            out.add(f"in {duration_text(-s)}" if s < 0 else f"{duration_text(s)} ago")
        elif fmt == "duration":
            out.add(duration_text(s))
        else:
            out.add(hms_text(max(0.0, s)))
    return out


def _frozen(page, url: str, *, refuse: tuple[str, ...] = ()) -> float:
    """Open ``url`` with the page's clock paused (Playwright's clock), the background reads named in
    ``refuse`` refused (``/landing``: the tiles' refresh; ``live``: triage's re-read of its live parts),
    and return the server's clock when it drew the page (``<body data-server-now>``, epoch seconds)."""
    def route(r):
        live_read = r.request.headers.get("x-tco-live-read") == "1"
        if ("live" in refuse and live_read) or any(r.request.url.split("?")[0].endswith(p) for p in refuse if p != "live"):
            r.abort()
        else:
            r.continue_()
    page.route("**/*", route)
    start = dt.datetime.now(dt.timezone.utc)
    page.clock.install(time=start)
    page.clock.pause_at(start + dt.timedelta(seconds=1))
    before = timezone.now().timestamp()
    page.goto(url)
    page.wait_for_selector("body")
    drawn = page.get_attribute("body", "data-server-now")
    if drawn is None:  # a page that keeps no clock (the old code): it was drawn about now, and its words never move
        return before
    assert before - 1 <= float(drawn) <= timezone.now().timestamp() + 1
    return float(drawn)


def _move_on(page) -> None:
    """Ten minutes on, then one more second: the jump fires the page's clock, the second writes it once more."""
    page.clock.fast_forward((MOVED_S - 1) * 1000)
    page.clock.fast_forward(1000)


def _text(page, selector: str) -> str:
    return " ".join((page.text_content(selector) or "").split())


def _held_jobs(tag: str) -> tuple[int, int]:
    """Two held jobs (``qsub -h``) tco has seen held: research's (``-P research``), then one submitted
    without a project."""
    teamed = _qsub("-h", "-P", "research", "-q", "agent.q", "-N", f"mv-teamed-{tag}")
    bare = _qsub("-h", "-q", "classic.q", "-N", f"mv-bare-{tag}")
    try:
        wait_until(lambda: Task.objects.filter(job_number__in=[teamed, bare], state="held", active=True).count() == 2,
                   90, "the held jobs seen by tco", 0.5)
    except BaseException:
        qdel_quietly(teamed, bare)
        raise
    return teamed, bare


def test_relative_times_move_on_with_no_push(ops_stack, browser, ops_logins):
    admin_password = os.environ["TCO_ADMIN_PASSWORD"]
    admin = ops_logins["admin"]
    tag = uuid.uuid4().hex[:6]
    teamed, bare = _held_jobs(tag)  # the first held by tco, as its triage records it
    waiting = None
    try:
        # Pending for good: more model API seats than the cluster has (the landing's longest pending).
        waiting = _qsub("-q", "classic.q", "-l", "anthropic_api=100000", "-N", f"mv-pending-{tag}")
        wait_until(lambda: Task.objects.filter(job_number=waiting, state="pending", active=True).exists(), 90,
                   "the pending job seen by tco", 0.5)
        cluster = Cluster.objects.get(pk=Task.objects.filter(job_number=teamed).values_list("cluster", flat=True)[0])
        held_at = timezone.now() - dt.timedelta(seconds=95)
        entry = AuditEntry.objects.create(user=admin, action="triage_hold", target=f"job:{teamed}", ok=True, result="")
        ControlRequest.objects.create(user=admin, audit=entry, cluster=cluster, action="triage_hold", control="hold",
                                      job_number=teamed, state="done", finished_at=held_at)
        submitted = {job: Task.objects.filter(job_number=job, active=True).aggregate(s=Min("submitted_at"))["s"]
                     for job in (teamed, bare)}
        clock = held_at.astimezone(dt.timezone.utc).strftime("%H:%M:%S UTC")

        # -- the triage page, ten minutes on with no push and no re-read
        with signed_in(browser, ops_stack, "admin", admin_password, viewport=DESKTOP) as page:
            drawn = _frozen(page, ops_stack.url + "/ops/triage/", refuse=("live",))
            row = f'#triage tr[data-job="{teamed}"]'
            page.wait_for_selector(row)
            reason = f'#reasons-{teamed} li:first-child'
            group = 'div.group[data-group="held_tco:admin:held"] h3'
            _move_on(page)
            now = drawn + MOVED_S
            assert _text(page, reason) in {f"held by admin in tco {w} ({clock})"
                                           for w in _words("ago", now - _epoch(held_at))}, _text(page, reason)
            assert _text(page, group) in {f"1 task is held by admin in tco {w} ({clock})"
                                          for w in _words("ago", now - _epoch(held_at))}, _text(page, group)
            for job in (teamed, bare):
                cell = f'#triage tr[data-job="{job}"] td[data-col="wait"]'
                assert _text(page, cell) in _words("hms", now - _epoch(submitted[job])), (job, _text(page, cell))
            assert page.evaluate("() => document.body.dataset.triageRead === undefined")  # never read again
            shot(page, "moving-times-triage")

        # -- the task page of the held job: the same hold among its reasons
        task = Task.objects.get(job_number=teamed)
        with signed_in(browser, ops_stack, "admin", admin_password, viewport=DESKTOP) as page:
            drawn = _frozen(page, f"{ops_stack.url}/tasks/{task.pk}/")
            first = "#pending-reasons li:first-child"
            page.wait_for_selector(first)
            _move_on(page)
            now = drawn + MOVED_S
            hint = "a Release (the triage page, or the campaign's Resume) lets it run"
            assert _text(page, first) in {f"held by admin in tco {w} ({clock}): {hint}"
                                          for w in _words("ago", now - _epoch(held_at))}, _text(page, first)

        # -- the queue page: the longest pending tile and the last poll, ten minutes on
        with signed_in(browser, ops_stack, "admin", admin_password, viewport=DESKTOP) as page:
            # The tiles come from the queue snapshot: wait for one that has a pending task (the page then
            # reads no other: its tiles' refresh is refused).
            wait_until(lambda: 'data-tile="longest"' in (body := page.request.get(ops_stack.url + "/landing").text())
                       and "<time" in body.split('data-tile="longest"', 1)[1].split("</a>", 1)[0], 90,
                       "a queue snapshot with a pending task", 1)
            drawn = _frozen(page, ops_stack.url + "/", refuse=("/landing",))
            value = '#tiles [data-tile="longest"] .tile-value time'
            page.wait_for_selector(value)
            page.wait_for_selector("#clusters p.last-poll time")
            _move_on(page)
            now = drawn + MOVED_S
            # The tile's task: one the database has (pending when the snapshot was made), its submission the
            # instant the words count from.
            since, shown = page.eval_on_selector(value, "t => [parseFloat(t.dataset.at), t.textContent]")
            submissions = Task.objects.filter(submitted_at__isnull=False).values_list("submitted_at", flat=True)
            instant = min(submissions, key=lambda s: abs(_epoch(s) - since))
            assert abs(_epoch(instant) - since) < 0.002
            assert shown in _words("duration", now - _epoch(instant)), shown
            # The last poll: its clock time as the snapshot said it, then how long ago, from that instant (read
            # together: a push may draw the line again, with a newer poll).
            cluster_name, polled, shown = page.eval_on_selector(
                "#clusters p.last-poll", "p => [p.dataset.cluster, parseFloat(p.querySelector('time').dataset.at), "
                                         "p.querySelector('time').textContent]")
            assert abs(polled - _epoch(Cluster.objects.get(name=cluster_name).polled_at)) < 600
            assert shown in _words("ago", now - polled), shown
            # The page's words are Python's, over their rounding edges.
            edges = [0, 0.4, 0.5, 1.5, 2.5, 59.4, 59.5, 60, 61.5, 3599, 3599.4, 3599.5, 3600, 3725.5, 16649.9,
                     86399, 86399.5, 172799, 172800, 200000]
            edges += [119.4, 119.5, 120.5, 7199.5, 7200]
            got = page.evaluate("xs => xs.map(x => [TCO.durationText(x), TCO.hmsText(x), TCO.spanText(x)])", edges)
            assert got == [[duration_text(x), hms_text(x), span_text(x)] for x in edges]
            shot(page, "moving-times-queue")

    finally:
        qdel_quietly(teamed, bare, waiting)


def test_the_triage_page_on_a_phone_gives_every_cell_its_line_and_says_a_missing_team(ops_stack, browser,
                                                                                      ops_logins):
    admin_password = os.environ["TCO_ADMIN_PASSWORD"]
    research = Team.objects.get(project="research")
    teamed, bare = _held_jobs(uuid.uuid4().hex[:6])
    try:
        with signed_in(browser, ops_stack, "admin", admin_password, viewport=PHONE) as phone:
            phone.goto(ops_stack.url + "/ops/triage/")
            for job, team in ((teamed, research.name), (bare, "no project")):
                row = f'#triage tr[data-job="{job}"]'
                phone.wait_for_selector(row)
                assert _text(phone, f'{row} td[data-label="Team"]') == team  # (its label is the cell's ::before)
                cells = phone.eval_on_selector_all(
                    f"{row} > td", """tds => tds.map(td => { const r = td.getBoundingClientRect();
                        return {label: td.dataset.label, top: r.top, bottom: r.bottom,
                                labelHeight: parseFloat(getComputedStyle(td, '::before').height)}; })""")
                for a, b in zip(cells, cells[1:]):
                    assert b["top"] >= a["bottom"] - 0.5, (job, a, b)  # one after the other, none over another
                for c in cells:
                    assert c["bottom"] - c["top"] >= c["labelHeight"] > 0, (job, c)  # each holds its label
            shot(phone, "moving-times-triage-390")
        # On a wide screen the same cells name the columns their headers name (the labels a phone shows).
        with signed_in(browser, ops_stack, "admin", admin_password, viewport=DESKTOP) as page:
            page.goto(ops_stack.url + "/ops/triage/")
            row = f'#triage tr[data-job="{teamed}"]'
            page.wait_for_selector(row)
            headers = page.eval_on_selector_all("#triage thead th", "ths => ths.map(th => th.innerText.trim())")
            assert page.eval_on_selector_all(f"{row} > td", "tds => tds.map(td => td.dataset.label)") == headers
    finally:
        qdel_quietly(teamed, bare)
