"""Bills, launching, urgent agents and triage in Debian's Chromium, on the real dev cluster.

Each test drives the pages as the role that uses them and saves screenshots
under var/test-output/ops-*.png.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from dashboards.core import rollups
from dashboards.core.errors import ActionRefused
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, AuditEntry, Campaign, Task, Team
from tests.helpers import wait_until
from tests.support.cluster import job_gone_or_deleting, qdel_quietly, qstat_jobs, SGE_ENV
from tests.support.history import make_campaign, make_task

from tests.support.stack import TEST_OUTPUT
from tests.support.browser import login

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def shot(page, name: str) -> None:
    page.screenshot(path=str(TEST_OUTPUT / f"ops-{name}.png"), full_page=True)


def cell(page, selector: str) -> str:
    return (page.text_content(selector) or "").strip()


def test_a_lead_reads_and_exports_a_bill_that_changes_when_a_campaign_finishes(ops_stack, browser_page, ops_logins):
    page = browser_page
    research = Team.objects.get(project="research")
    login(page, ops_stack, "lead")
    bill_url = ops_stack.url + "/ops/bills/?period=day&group_by=team"
    page.goto(bill_url)
    page.wait_for_selector("#bill-form")
    # The team's own line: jobs other accounts ran under research's project have a line of their own (issue 11).
    row = 'tr[data-project="research"]:not(.not-tco)'

    def team_row() -> dict[str, float]:
        # The stack ingests the whole accounting file: research already has the other suites' jobs of today.
        if page.locator(row).count() == 0:
            return {"tasks": 0, "wallclock_s": 0.0, "cost_usd": 0.0}
        return {"tasks": int(cell(page, f'{row} td[data-col="tasks"]')),
                "wallclock_s": float(cell(page, f'{row} td[data-col="wallclock_s"]').replace(",", "")),
                "cost_usd": float(cell(page, f'{row} td[data-col="cost_usd"]').lstrip("$").replace(",", "") or 0)}

    before = team_row()
    shot(page, "bill-before")

    campaign = launch(user=ops_logins["launcher"], request=LaunchRequest(team=research, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        name="billed", inputs=[{"task": n, "duration_s": 2.0} for n in range(1, 4)])).campaign
    wait_until(lambda: Campaign.objects.get(pk=campaign.pk).status == "finished", 180, "the campaign to finish", 0.5)
    # The demo agent calls no model, so its runner records carry no usage: once they are ingested,
    # give the tasks the tokens and cost a metered agent would have.
    try:
        wait_until(lambda: not Task.objects.filter(campaign=campaign, runner_record__isnull=True).exists(), 60,
                   "the runner records", 0.5)
    except AssertionError:
        pass  # a runner that wrote no record: nothing will overwrite the values below
    with rollups.tasks_rolled(Task.objects.filter(campaign=campaign).values_list("id", flat=True)):
        # as the ingest of runner records stores usage: the bills, which read the rollups, count it
        Task.objects.filter(campaign=campaign).update(input_tokens=1000, output_tokens=500, cost_usd=Decimal("0.0125"))
    wallclock = sum(Task.objects.filter(campaign=campaign).values_list("wallclock_s", flat=True))

    page.reload()
    page.wait_for_selector(row)
    after = team_row()
    assert after["tasks"] >= before["tasks"] + 3
    assert after["cost_usd"] == pytest.approx(before["cost_usd"] + 0.0375)
    assert after["wallclock_s"] >= before["wallclock_s"] + wallclock - 1
    assert after != before
    page.select_option("#id_group_by", "campaign")
    page.click("#bill-show")
    mine = f'tr[data-key="billed (#{campaign.pk})"]'
    page.wait_for_selector(mine)
    assert cell(page, f'{mine} td[data-col="tasks"]') == "3"
    assert cell(page, f'{mine} td[data-col="cost_usd"]') == "$0.0375"
    assert cell(page, f'{mine} td[data-col="total_tokens"]') == "4500"
    assert float(cell(page, f'{mine} td[data-col="wallclock_s"]')) == round(wallclock)
    shot(page, "bill-after")

    with page.expect_download() as info:
        page.click("#bill-csv")
    path = TEST_OUTPUT / "ops-bill.csv"
    info.value.save_as(str(path))
    rows = list(csv.DictReader(path.open()))
    (mine,) = [r for r in rows if r["group"] == f"billed (#{campaign.pk})"]
    assert mine["cost_usd"] == "0.0375" and mine["tasks"] == "3" and float(mine["wallclock_s"]) == wallclock

    # The launcher is told by e-mail that the campaign finished (mail goes to files in this stack).
    def mailed() -> bool:
        for message in Path(ops_stack.mail_dir).glob("*.log"):
            text = message.read_text(errors="replace")
            if "campaign billed finished" in text and "launcher@example.org" in text:
                return True
        return False

    wait_until(mailed, 60, "the finished notice e-mail", 0.5)

    # A daily budget the campaign already crossed: alerts on the page (and by e-mail), launches refused.
    page.goto(ops_stack.url + "/ops/budgets/")
    page.select_option("#id_period", "day")
    page.fill("#id_amount_usd", "0.05")
    page.fill("#id_thresholds", "50, fifty")
    page.click("#budget-save")
    page.wait_for_selector(".error")
    assert "not a number" in cell(page, "#budget-form")
    assert page.input_value("#id_thresholds") == "50, fifty"  # kept as typed
    assert page.input_value("#id_amount_usd") == "0.05"
    page.fill("#id_thresholds", "50, 100")
    page.fill("#id_alert_emails", "finance@example.org")
    page.click("#budget-save")
    page.wait_for_selector("ul.messages")
    alerts = cell(page, '#budgets-research tr[data-period="day"] td.alerts')
    assert "50%" in alerts and "100%" not in alerts  # $0.0375 of $0.05 is 75%
    shot(page, "budget")
    with pytest.raises(ActionRefused, match="over budget"):
        launch(user=ops_logins["launcher"], request=LaunchRequest(team=research,
                                          agent_definition=AgentDefinition.objects.get(name="demo-agent"),
                                          name="too-much", inputs=[{}, {}]))  # forecast 2 x $0.0125


def test_a_launcher_sees_a_forecast_and_launches(ops_stack, browser_page, ops_logins):
    page = browser_page
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    history = make_campaign(team=research, user=ops_logins["launcher"], name="earlier", agent=agent)
    for n, cost in enumerate(("0.010", "0.020", "0.030", "0.040", "0.050"), start=1):
        make_task(history, task_number=n, started_at=Campaign.objects.get(pk=history.pk).launched_at,
                  cost_usd=cost, tokens={"input_tokens": 800 * n, "output_tokens": 200 * n})
    login(page, ops_stack, "launcher")
    page.goto(ops_stack.url + "/ops/launch/")
    page.fill("#id_name", "from-the-browser")
    page.fill("#id_input_params", "task=1..4")
    page.fill("#id_name", "bad name: -u root")
    page.click("#launch-preview")
    page.wait_for_selector(".field-error")
    assert "no spaces" in cell(page, "#field-name .field-error")
    assert page.input_value("#id_input_params") == "task=1..4"  # nothing typed is lost
    shot(page, "launch-refused")
    page.fill("#id_name", "from-the-browser")
    page.click("#launch-preview")
    page.wait_for_selector("#forecast")
    assert cell(page, '#forecast-cost td[data-q="p50"]') == "$0.1200"  # median $0.03 x 4 tasks
    assert cell(page, '#forecast-cost td[data-q="p10"]') == "$0.0560"
    assert cell(page, '#forecast-cost td[data-q="p90"]') == "$0.1840"
    assert not Campaign.objects.filter(name="from-the-browser").exists()
    shot(page, "launch-forecast")
    page.click("#launch-submit")
    page.wait_for_url("**/campaigns/*/", timeout=15000)  # the live page, to watch it on (issue 24)
    assert "/ops/" not in page.url
    campaign = Campaign.objects.get(name="from-the-browser")
    assert campaign.task_count == 4 and campaign.launched_by == ops_logins["launcher"]
    wait_until(lambda: Campaign.objects.get(pk=campaign.pk).job_number, 60, "the submission")
    page.reload()
    assert cell(page, "#job-number") == str(Campaign.objects.get(pk=campaign.pk).job_number)
    shot(page, "launch-done")
    entry = AuditEntry.objects.get(action="launch", target=f"campaign:{campaign.pk}")
    assert entry.ok and entry.user == ops_logins["launcher"]


def test_an_urgent_agent_starts_at_the_next_free_slot_while_a_full_campaign_queues(ops_stack, browser_page,
                                                                                    ops_logins):
    page = browser_page
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    # 16 model API seats per task: six tasks fill the 96 seats, the other six queue.
    full = launch(user=ops_logins["launcher"], request=LaunchRequest(team=research, agent_definition=agent, name="full", seats_per_task=16,
        inputs=[{"task": n, "duration_s": 20.0} for n in range(1, 13)])).campaign
    try:
        def queuing() -> bool:
            states = set(Task.objects.filter(campaign=full).values_list("state", flat=True))
            return "running" in states and "pending" in states

        wait_until(queuing, 90, "the full campaign to run and queue", 0.5)
        login(page, ops_stack, "urgent")
        page.goto(ops_stack.url + "/ops/urgent/")
        page.fill("#id_input", '{"task": 1, "duration_s": 1}')
        page.fill("#id_name", "jump")
        # As many seats as a queued campaign task: it cannot slip into seats left over by other jobs,
        # so it must wait for the next free ones, and take them before the campaign's queued tasks.
        page.fill("#id_seats_per_task", "16")
        page.click("#urgent-submit")
        page.wait_for_selector("ul.messages")
        urgent = Campaign.objects.get(name="jump")
        assert urgent.urgent and urgent.priority == 1024
        wait_until(lambda: Campaign.objects.get(pk=urgent.pk).job_number, 60, "the urgent submission")
        queued_then = set(Task.objects.filter(campaign=full, state="pending").values_list("task_number", flat=True))
        assert queued_then, "the campaign must still be queuing when the urgent agent is submitted"
        shot(page, "urgent-waiting")

        row = f'tr[data-campaign="{urgent.pk}"]'
        wait_until(lambda: cell(page, f'{row} td[data-col="started"]') != "", 120, "the urgent agent to start", 0.5)
        urgent_task = Task.objects.get(campaign=urgent)
        assert urgent_task.started_at is not None
        # Nothing that was queuing when it was submitted started before it.
        for task in Task.objects.filter(campaign=full, task_number__in=queued_then, started_at__isnull=False):
            assert task.started_at >= urgent_task.started_at, (task.task_number, task.started_at,
                                                               urgent_task.started_at)
        waited = float(page.get_attribute(f'{row} td[data-col="waited"]', "data-seconds"))
        assert waited > 0 and "s" in cell(page, f'{row} td[data-col="waited"]')
        shot(page, "urgent-started")

        # Cancel the full campaign from its control page (with confirmation).
        page.goto(ops_stack.url + f"/ops/campaigns/{full.pk}/")
        page.click("#control-cancel")
        page.wait_for_selector("#confirm")
        shot(page, "cancel-confirm")
        page.click("#confirm")
        page.wait_for_selector("ul.messages")
        job = Campaign.objects.get(pk=full.pk).job_number
        wait_until(lambda: job_gone_or_deleting(job), 60, "the campaign deleted")
        wait_until(lambda: AuditEntry.objects.filter(action="campaign_cancel", ok=True).exists(), 30,
                   "the cancel recorded")
        wait_until(lambda: not Task.objects.filter(campaign=full, state__in=("running", "pending", "starting"))
                   .exists(), 60, "the poll to see the tasks go")
        page.reload()
        assert "deleted: job" in cell(page, "#history")
        shot(page, "cancelled")
    finally:
        qdel_quietly(Campaign.objects.get(pk=full.pk).job_number)


def test_an_admin_clears_an_error_state_from_triage(ops_stack, browser_page, ops_logins, tmp_path):
    page = browser_page
    workdir = Path("/tmp") / f"tco-eqw-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(["qsub", "-terse", "-b", "y", "-wd", str(workdir), "-o", "/dev/null", "-e", "/dev/null",
                          "-P", "research", "-q", "agent.q", "-N", "eqw-triage", "/bin/sleep", "2"],
                         capture_output=True, text=True, env=SGE_ENV, check=True)
    job = int(out.stdout.strip().split(".")[0])
    try:
        wait_until(lambda: Task.objects.filter(job_number=job, state="error", active=True).exists(), 90,
                   "the job in the error state on tco's side", 0.5)
        workdir.mkdir()  # the cause is fixed; now the error can be cleared
        login(page, ops_stack, "admin", os.environ["TCO_ADMIN_PASSWORD"])
        page.goto(ops_stack.url + "/ops/triage/")
        row = f'tr[data-job="{job}"]'
        page.wait_for_selector(row)
        # Its row is marked an error (other jobs left waiting on the shared cluster may come first: the
        # table sorts by wait).
        assert page.get_attribute(row, "class") == "state-error"
        assert "error state" in cell(page, f"{row} td.reasons")
        shot(page, "triage-error")
        assert page.input_value(f"{row} select[name=action]") == "clear_error"
        page.click(f"{row} button[type=submit]")
        page.wait_for_selector("#confirm")
        assert f"Clear error job {job}?" in cell(page, "h1")
        shot(page, "triage-confirm")
        page.click("#confirm")
        page.wait_for_selector("ul.messages")

        def cleared() -> bool:
            state = qstat_jobs().get(job, {}).get("states", "")
            return "E" not in state
        wait_until(cleared, 60, "the error state cleared on the cluster", 0.5)
        entry = wait_until(lambda: AuditEntry.objects.filter(action="triage_clear_error", ok=True).first(), 30,
                           "the action recorded")
        assert entry.user == ops_logins["admin"] and str(job) in entry.result
        page.goto(ops_stack.url + "/ops/triage/")
        page.wait_for_selector("#triage-recent")
        assert "error state cleared" in cell(page, "#triage-recent")
        shot(page, "triage-cleared")
        page.goto(ops_stack.url + "/ops/audit/")
        page.wait_for_selector('tr[data-action="triage_clear_error"]')
        shot(page, "audit")
    finally:
        qdel_quietly(job)
        shutil.rmtree(workdir, ignore_errors=True)
