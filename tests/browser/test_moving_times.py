"""Issue 24, the users' day, in Debian's Chromium on the live stack and the real dev cluster.

The triage page at 390 px: every cell of a job keeps its own line with its label, the Team cell of a job
submitted without a project says so (it was an empty cell 3 px high, its label over the next one).
"""
from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from dashboards.models import Task, Team
from tests.helpers import wait_until
from tests.support.browser import shot, signed_in
from tests.support.cluster import SGE_ENV, qdel_quietly

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

DESKTOP = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}


def _qsub(*args: str) -> int:
    out = subprocess.run(["qsub", "-terse", "-b", "y", "-o", "/dev/null", "-e", "/dev/null", *args, "/bin/sleep", "5"],
                         capture_output=True, text=True, env=SGE_ENV, check=True)
    return int(out.stdout.strip().split(".")[0])


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
