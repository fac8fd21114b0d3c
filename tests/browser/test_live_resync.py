"""A live page that misses messages ends with the same view as a fresh page load (issue 22, docs/live.md),
in Debian's Chromium against the live stack (uvicorn with its worker processes, the live views'
producer, the Celery worker and beat):

- a busy tab (its script blocked while changes go out: they queue up in the browser),
- a socket closed by the server to reconnect (a role saved: ``RECHECK``) while changes go on,
- the web process holding the page's socket killed (SIGKILL) mid-run: uvicorn starts another, the
  page reconnects to whichever answers.

After each, the page must show what the database holds (counted here from the rows, not through the
pages' readers) and exactly what a page loaded afresh shows. The changes are written as a writer does
(the rows, then ``core.realtime.queue_changed`` after the commit) on a campaign whose tasks have all
ended, so the cluster's own poll never touches them.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from dashboards.core import realtime
from dashboards.models import Membership, Task, Team

from tests.support.campaigns import DEMO_PASSWORD, make_campaign
from tests.support.stack import TEST_OUTPUT

pytestmark = [pytest.mark.browser, pytest.mark.integration]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

TASKS = 250

VIEW_JS = """() => ({
  states: Array.from(document.querySelectorAll('#states td')).map(td => [td.dataset.state, td.textContent]),
  progress: document.getElementById('progress-text').textContent,
  rows: Array.from(document.querySelectorAll('#tasks tbody tr')).map(tr => [tr.dataset.taskNumber,
        tr.className, tr.querySelector('[data-col=exit]').textContent]),
})"""


class Writer(threading.Thread):
    """Flips ``changes`` tasks of ``campaign`` between done and failed, one commit each, ``every_s`` apart,
    each followed by the change mark a writer sends after its commit."""

    def __init__(self, campaign, changes: int, every_s: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.campaign, self.changes, self.every_s, self.seed = campaign, changes, every_s, seed
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        try:
            for i in range(self.changes):
                number = (self.seed * 37 + i * 53) % TASKS + 1
                with transaction.atomic():
                    task = Task.objects.select_for_update().get(campaign=self.campaign, task_number=number)
                    failed = task.state != "failed"
                    Task.objects.filter(pk=task.pk).update(state="failed" if failed else "done",
                                                           exit_status=1 if failed else 0)
                    realtime.queue_changed("dev", {self.campaign.pk})
                time.sleep(self.every_s)
        except BaseException as exc:  # noqa: BLE001 - raised by the test
            self.error = exc
        finally:
            connection.close()

    def finish(self) -> None:
        self.join(timeout=120)
        assert self.error is None, self.error


def truth(campaign) -> dict:
    """What the campaign page must show, from the rows: its counts and its first page's rows (failures
    first, then by task number: the page's order)."""
    rows = list(Task.objects.filter(campaign=campaign).values_list("task_number", "state", "exit_status"))
    failed = sorted(r for r in rows if r[1] == "failed")
    done = sorted(r for r in rows if r[1] == "done")
    first = (failed + done)[:100]
    return {"failed": len(failed), "done": len(done),
            "rows": [[str(n), f"state-{state}", str(exit_status)] for n, state, exit_status in first]}


def shown(page) -> dict:
    view = page.evaluate(VIEW_JS)
    return {**view, "counts": {s: int(n) for s, n in view["states"] if n.strip().isdigit()}}


def settle(page, campaign, what: str, timeout: float = 30.0) -> dict:
    """Wait until ``page`` shows the database's state of ``campaign``; then a fresh page load must show
    exactly the same."""
    want = truth(campaign)
    deadline = time.monotonic() + timeout
    view = None
    while time.monotonic() < deadline:
        view = shown(page)
        if (view["counts"].get("failed"), view["counts"].get("done"), view["rows"]) == (
                want["failed"], want["done"], want["rows"]):
            break
        time.sleep(0.25)
    else:
        page.screenshot(path=str(TEST_OUTPUT / f"resync-{what}.png"), full_page=True)
        raise AssertionError(f"after {what}: the page shows {view and view['counts']}, the database "
                             f"{ {'failed': want['failed'], 'done': want['done']} }")
    fresh = page.context.new_page()
    try:
        fresh.goto(page.url)
        fresh.wait_for_selector("#live.on", timeout=15000)
        assert shown(fresh) == view, f"after {what}: a fresh page load shows another view"
    finally:
        fresh.close()
    return view


def socket_owners(stack) -> list[int]:
    """The web server's worker processes holding an established TCP connection on its port."""
    port = f"{stack.port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(":" + port) and fields[3] == "01":   # local port, ESTABLISHED
                inodes.add(fields[9])
    web = dict(stack.procs)["web"].pid
    children = [int(p) for p in Path(f"/proc/{web}/task/{web}/children").read_text().split()]
    owners = []
    for pid in children:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            owners.append(pid)
    return owners


def test_a_page_that_misses_messages_ends_as_a_fresh_load_does(live_stack, browser_page, role_users):
    page = browser_page
    research = Team.objects.get(project="research")
    viewer = role_users["viewer"]
    now = timezone.now()
    campaign = make_campaign(team=research, user=role_users["admin"], name="resync", job_number=990001,
                             status="running",
                             tasks=[{"state": "done", "exit_status": 0, "failed_code": 0, "ended_at": now,
                                     "host": f"h{n % 3}"} for n in range(TASKS)])
    page.goto(live_stack.url + "/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", DEMO_PASSWORD)
    page.click("#login-submit")
    page.wait_for_selector("#live.on", timeout=15000)
    # A second tab on the queue page goes through the same.
    queue_tab = page.context.new_page()
    queue_tab.goto(live_stack.url + "/")
    queue_tab.wait_for_selector("#live.on", timeout=15000)
    page.goto(f"{live_stack.url}/campaigns/{campaign.pk}/")
    page.wait_for_selector("#live.on", timeout=15000)
    settle(page, campaign, "the first load")

    # 1. A busy tab: the page's script is blocked for 4 s while 20 changes go out.
    writer = Writer(campaign, 20, 0.15, seed=1)
    writer.start()
    page.evaluate("() => { const t = Date.now(); while (Date.now() - t < 4000) {} }")
    writer.finish()
    settle(page, campaign, "a busy tab")

    # 2. The server closes the socket to reconnect (a role saved) while changes go on.
    writer = Writer(campaign, 15, 0.1, seed=2)
    writer.start()
    time.sleep(0.3)
    with transaction.atomic():
        Membership.objects.get(user=viewer, team=research).save()
    writer.finish()
    settle(page, campaign, "a reconnect")

    # 3. The web process holding the page's socket is killed mid-run.
    owners = socket_owners(live_stack)
    assert owners, "no web process holds the page's socket"
    writer = Writer(campaign, 20, 0.1, seed=3)
    writer.start()
    time.sleep(0.5)
    for pid in owners:
        os.kill(pid, signal.SIGKILL)
    writer.finish()
    page.wait_for_selector("#live.on", timeout=30000)
    view = settle(page, campaign, "a killed web process", timeout=60.0)
    assert view["counts"]["failed"] > 0
    assert not set(owners) & set(socket_owners(live_stack)), "the killed process still holds sockets"
    page.screenshot(path=str(TEST_OUTPUT / "resync-done.png"), full_page=True)

    # The queue tab's counts of the campaign: the database's, and a fresh load's.
    counts_js = f"""() => Object.fromEntries(Array.from(document.querySelectorAll(
        'tr[data-campaign="{campaign.pk}"] td[data-state]')).map(td => [td.dataset.state, td.textContent]))"""
    want = truth(campaign)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        counts = queue_tab.evaluate(counts_js)
        if (counts.get("failed"), counts.get("done")) == (str(want["failed"]), str(want["done"])):
            break
        time.sleep(0.25)
    assert (counts.get("failed"), counts.get("done")) == (str(want["failed"]), str(want["done"])), counts
    fresh = page.context.new_page()
    fresh.goto(live_stack.url + "/")
    fresh.wait_for_selector("#live.on", timeout=15000)
    assert fresh.evaluate(counts_js) == counts
