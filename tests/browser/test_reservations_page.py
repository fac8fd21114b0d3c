"""Issue 17: a launcher books an advance reservation from the page (qrsub on the real dev cluster)
and sees it on the queue page; a viewer may not book. Screenshots: var/test-output/issue17-*.png."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import uuid

import pytest

from dashboards.models import Reservation, Team
from tests.support.cluster import SGE_ENV

from tests.support.stack import TEST_OUTPUT
from tests.support.browser import login

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def test_a_launcher_books_a_reservation_and_sees_it_on_the_queue_page(ops_stack, browser_page, ops_logins):
    page = browser_page
    name = f"br-{uuid.uuid4().hex[:6]}"
    start = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)).replace(second=0, microsecond=0)
    research = Team.objects.get(project="research")
    ar = None
    try:
        login(page, ops_stack, "launcher")
        page.goto(ops_stack.url + "/ops/reservations/")
        page.select_option("#id_team", str(research.pk))
        page.fill("#id_name", name)
        page.fill("#id_start", start.strftime("%Y-%m-%dT%H:%M"))
        page.fill("#id_duration_min", "20")
        page.select_option("#id_queue", "classic.q")
        page.fill("#id_slots", "1")
        page.fill("#id_seats", "2")
        page.click("#book")
        page.wait_for_selector("#reservation-message", timeout=30000)
        page.screenshot(path=str(TEST_OUTPUT / "issue17-booked.png"), full_page=True)
        booking = Reservation.objects.get(name=name)
        ar = booking.ar_id
        assert booking.team == research and booking.booked_by.get_username() == "launcher"
        # The scheduler has it, as booked (plain qrstat, read here).
        listed = subprocess.run(["qrstat", "-u", "*"], capture_output=True, text=True, env=SGE_ENV).stdout
        assert any(line.split()[:2] == [str(ar), name] for line in listed.splitlines()), listed

        page.goto(ops_stack.url + "/")
        row = f"#reservations-card #reservation-{ar}"
        page.wait_for_selector(row)
        cells = [(c or "").strip() for c in page.locator(f"{row} td").all_text_contents()]
        assert cells[1] == name and cells[2] == research.name and cells[3] == "launcher"
        assert cells[4] == start.strftime("%Y-%m-%d %H:%M") and cells[7] == "waiting"
        assert cells[10] == "0 of 2"
        page.screenshot(path=str(TEST_OUTPUT / "issue17-queue.png"), full_page=True)

        login(page, ops_stack, "viewer")
        answer = page.goto(ops_stack.url + "/ops/reservations/")
        assert answer.status == 403
    finally:
        if ar is not None:
            subprocess.run(["qrdel", str(ar)], capture_output=True, env=SGE_ENV)
