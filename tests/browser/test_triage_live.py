"""The triage page is live (issues 22 and 24): a job released outside the page (the CLI, another admin)
changes its row without a reload, in Debian's Chromium on the live stack and the real dev cluster.

The page follows the admin's queue view on the live path (static/js/triage_live.js) and reads its live
parts again when the waiting counts change. The job asks for more model API seats than the cluster has,
so once released it waits (pending) instead of starting and leaving the page.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from dashboards.models import Task
from tests.helpers import wait_until
from tests.support.browser import login
from tests.support.cluster import SGE_ENV, qdel_quietly
from tests.support.stack import TEST_OUTPUT

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def test_a_job_released_elsewhere_changes_its_triage_row_without_a_reload(ops_stack, browser_page, ops_logins):
    page = browser_page
    out = subprocess.run(["qsub", "-terse", "-h", "-b", "y", "-q", "classic.q", "-l", "anthropic_api=100000",
                          "-N", "triage-live", "-o", "/dev/null", "-e", "/dev/null", "/bin/sleep", "5"],
                         capture_output=True, text=True, env=SGE_ENV, check=True)
    job = int(out.stdout.strip().split(".")[0])
    row = f'#triage-live-jobs tr[data-job="{job}"]'
    try:
        wait_until(lambda: Task.objects.filter(job_number=job, state="held", active=True).exists(), 60,
                   "the held job on tco's side", 0.5)
        login(page, ops_stack, "admin", os.environ["TCO_ADMIN_PASSWORD"])
        page.goto(ops_stack.url + "/ops/triage/")
        page.wait_for_selector(row)
        page.wait_for_selector("#live.on", timeout=15000)
        tasks_cell = f"{row} td:nth-child(5)"
        assert "held" in page.text_content(tasks_cell)
        assert page.input_value(f"{row} select[name=action]") == "release"
        page.evaluate("() => { window.triageNotReloaded = true; }")   # gone if the page were loaded again

        subprocess.run(["qrls", str(job)], capture_output=True, env=SGE_ENV, check=True)
        wait_until(lambda: Task.objects.filter(job_number=job, state="pending", active=True).exists(), 60,
                   "the poll's write of the release", 0.5)
        page.wait_for_function(
            f"""() => {{ const c = document.querySelector('{tasks_cell}');
                        return c && c.textContent.includes('pending') && !c.textContent.includes('held'); }}""",
            timeout=30000)
        assert page.evaluate("() => window.triageNotReloaded === true")
        # The row as a fresh load shows it: released, so "release" is no longer the chosen action.
        assert page.input_value(f"{row} select[name=action]") != "release"
        page.screenshot(path=str(TEST_OUTPUT / "triage-live-released.png"), full_page=True)
    finally:
        qdel_quietly(job)
