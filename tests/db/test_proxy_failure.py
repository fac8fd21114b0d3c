"""A task whose metering proxy never listened (issue 23/22): tco's infrastructure failed it, not the agent.

The runner records here are written by tco's runner itself (``execution.runner.main.Runner``: its
``_stop_proxy`` and ``_write_record``) around a real ``ProxyStarter`` whose start fails (a price table
that is not JSON: the start raises before the proxy listens), and ingested from the spool as the
worker does. Every expected figure is worked out by hand from the tasks the test builds:

    task  end                         runner record                         cost   wall x slots
    1     done                        none                                  $1.00  100 s x 1
    2     failed, exit 3              none (the agent's own failure)        $0.50   50 s x 1
    3     failed, exit 1              proxy never listened                  none    40 s x 2
    4     failed, exit 1              proxy listened, did not stop cleanly  none    30 s x 1
    5     failed, exit 143            proxy never listened, runner signalled none   20 s x 1

Only task 3 is the infrastructure's: the campaign page and the agent page say so in words, the
control page offers to retry it, and the waste view shows its 80 slot-seconds apart from the team's
waste (tasks 2, 4, 5: $0.50, 50 + 30 + 20 = 100 slot-seconds), with the bill still counting all
280 slot-seconds. On the code before, task 3 read "the agent exited with status 1" and was wasted.
"""
from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import pytest
from django.conf import settings as django_settings
from django.db.models import Count

from dashboards.billing import bills, waste
from dashboards.control.actions import campaign_controls
from dashboards.core import failures, rollups
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.live.campaign import campaign_detail
from dashboards.live.task import task_detail
from dashboards.models import Task
from execution.metering.endpoints import Limits
from execution.runner.config import read_task
from execution.runner.main import Runner
from execution.runner.proxy_start import ProxyPlan, ProxyStarter
from execution.spool.record import RunnerRecord
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
DAY = T0.date()
HOST = "sge-exec1"


def s(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def failed(task: Task, exit_status: int) -> None:
    """The task's accounting as ingest stores it: failed 0 with the agent's exit status, on HOST."""
    with rollups.tasks_rolled([task.pk]):
        Task.objects.filter(pk=task.pk).update(failed_code=0, exit_status=exit_status, host=HOST)


def runner_for(task: Task) -> Runner:
    spool = str(django_settings.TCO_SPOOL_DIR)
    runner = Runner({"TCO_SPOOL_DIR": spool, "TCO_CAMPAIGN_ID": str(task.campaign_id),
                     "JOB_ID": str(task.job_number), "SGE_TASK_ID": str(task.task_number)})
    runner.task = read_task(runner.environ)
    os.makedirs(runner.task.record_dir, mode=0o700, exist_ok=True)
    return runner


def record_of_a_proxy_that_never_listened(task: Task, tmp_path, *, signalled: bool = False) -> dict:
    """tco's runner's record for ``task`` whose agent asked for its model API, got its connection
    refused (the proxy's start failed) and exited 1 (or the runner was signalled: 143)."""
    runner = runner_for(task)
    prices = tmp_path / f"prices-{task.task_number}.json"
    prices.write_text("{not json")
    plan = ProxyPlan(policy={}, upstreams={}, registered=(), credentials_file=str(tmp_path / "credentials.json"),
                     prices_file=str(prices), token_cap=None, cost_cap=None, limits=Limits())
    runner.proxy = ProxyStarter(plan, socket_path=str(tmp_path / f"proxy-{task.task_number}.sock"),
                                requests_path=runner.task.task_file("requests.jsonl"))
    runner.proxy.start_soon()   # the agent wants its base URL
    runner.proxy.thread.join(60)
    assert not runner.proxy.thread.is_alive() and runner.proxy.handle is None
    if signalled:
        runner.signals.runner_signal = 15
        runner.flags.append("runner_signalled")
    runner.exit_status = 143 if signalled else 1
    runner._stop_proxy()
    runner.exit_code = runner.exit_status
    assert runner._write_record() == runner.exit_status
    return RunnerRecord.read(runner.task.layout.record_path(task.campaign_id, task.task_number)).to_json()


def record_of_a_proxy_that_did_not_stop(task: Task) -> None:
    """A record whose proxy listened (its requests file is named and exists) and failed to stop cleanly."""
    runner = runner_for(task)
    requests = runner.task.task_file("requests.jsonl")
    open(requests, "w").close()
    RunnerRecord(campaign_id=str(task.campaign_id), task_number=task.task_number, job_number=task.job_number,
                 hostname=HOST, stages={}, exit_status=1, requests_path=requests, flags=["proxy_error"],
                 error="metering proxy did not stop: TimeoutError()").write(
        runner.task.layout.record_path(task.campaign_id, task.task_number))


@pytest.fixture
def campaign(bootstrap, ops_users, research, tmp_path):
    c = make_campaign(team=research, user=ops_users["launcher"], name="proxy-down", count=5)
    make_task(c, task_number=1, started_at=s(0), wallclock_s=100, cost_usd="1.00", tokens={"output_tokens": 9})
    tasks = {1: None}
    for number, start, wall, slots, cost in ((2, 10, 50, 1, "0.50"), (3, 20, 40, 2, None), (4, 30, 30, 1, None),
                                             (5, 40, 20, 1, None)):
        tasks[number] = make_task(c, task_number=number, started_at=s(start), wallclock_s=wall, slots=slots,
                                  state="failed", cost_usd=cost)
    for number, status in ((2, 3), (3, 1), (4, 1), (5, 143)):
        failed(tasks[number], status)
    records = {3: record_of_a_proxy_that_never_listened(tasks[3], tmp_path),
               5: record_of_a_proxy_that_never_listened(tasks[5], tmp_path, signalled=True)}
    record_of_a_proxy_that_did_not_stop(tasks[4])
    result = ingest_runner_records(c.cluster)
    assert (result.ingested, result.quarantined) == (3, 0)
    return {"campaign": c, "records": records, "tasks": {n: Task.objects.get(campaign=c, task_number=n)
                                                         for n in range(1, 6)}}


def test_the_runner_records_a_proxy_that_never_listened_with_its_flag_and_no_requests_file(campaign):
    record = campaign["records"][3]
    assert record["flags"] == ["proxy_error"] and record["requests_path"] is None
    assert record["error"].startswith("metering proxy did not start: ")
    assert campaign["tasks"][3].runner_record["flags"] == ["proxy_error"]


def test_a_task_whose_proxy_never_listened_is_the_infrastructures_failure_in_words(campaign, ops_users):
    admin, tasks = ops_users["admin"], campaign["tasks"]
    error = campaign["records"][3]["error"]
    words = (f"tco's metering proxy did not start on {HOST}: the agent never reached its model API "
             f"(infrastructure, not the agent; runner: {error}; exit status 1)")
    assert task_detail(admin, tasks[3].pk)["task"]["failure"] == {"kind": "infrastructure", "text": words}
    # The others are the agent's: its own exit, a proxy that served it, a signal to the runner.
    assert task_detail(admin, tasks[2].pk)["task"]["failure"] == {
        "kind": "agent", "text": f"the agent exited with status 3 on {HOST}"}
    assert task_detail(admin, tasks[4].pk)["task"]["failure"]["kind"] == "agent"
    assert task_detail(admin, tasks[5].pk)["task"]["failure"] == {
        "kind": "agent", "text": f"the agent exited with status 143 on {HOST}"}
    detail = campaign_detail(admin, campaign["campaign"].pk)
    assert detail["infrastructure_failures"] == 1
    assert next(t for t in detail["tasks"] if t["task_number"] == 3)["failure"]["text"] == words


def test_the_control_page_offers_the_retry_of_the_infrastructures_failures(campaign):
    c = campaign["campaign"]
    assert list(Task.objects.filter(campaign=c).filter(failures.infrastructure_filter())
                .values_list("task_number", flat=True)) == [3]
    states = dict(Task.objects.filter(campaign=c).values_list("state").annotate(n=Count("id")).order_by())
    controls = campaign_controls(c, states)
    assert controls["retry"] == {"count": 4, "why": ""}
    assert controls["retry_infrastructure"] == {"count": 1, "why": ""}


@pytest.mark.parametrize("from_detail", [False, True], ids=["rollups", "detail"])
def test_the_waste_view_shows_the_infrastructures_failure_apart_and_the_bill_keeps_it(campaign, research,
                                                                                     from_detail):
    c = campaign["campaign"]
    result = waste.waste(teams=[research], first=DAY, last=DAY, campaign=c.pk, seats=False, from_detail=from_detail)
    (row,) = result["rows"]

    def figures(name):
        return (row[name]["tasks"], row[name]["cost_usd"], row[name]["slot_s"])

    # Spent, as on the bill: 5 tasks, $1.50, 100 + 50 + 40 x 2 + 30 + 20 = 280 slot-seconds.
    assert figures("spent") == (5, Decimal("1.50"), 280.0)
    assert figures("infrastructure") == (1, Decimal(0), 80.0)              # task 3
    assert figures("failed") == (3, Decimal("0.50"), 100.0)                # tasks 2, 4, 5
    assert figures("wasted") == (3, Decimal("0.50"), 100.0)
    assert row["wasted_slot_share"] == 100.0 / 280.0
    assert result["totals"]["infrastructure"]["slot_s"] == 80.0
    bill = bills.bill(teams=[research], period="day", first=DAY, last=DAY, campaign=c.pk)
    assert bill["totals"]["slot_s"] == 280.0 and bill["totals"]["tasks"] == 5


def test_the_waste_page_and_the_bill_say_the_infrastructures_share_apart(campaign, client, ops_users):
    client.force_login(ops_users["lead"])
    html = client.get("/ops/waste/", {"first": DAY.isoformat(), "last": DAY.isoformat()}).content.decode()
    row = html.split(f'data-campaign="{campaign["campaign"].pk}"', 1)[1].split("</tr>", 1)[0]
    cell = row.split('data-col="infrastructure"', 1)[1].split("</td>", 1)[0]
    assert "1 task " in cell and "80 slot-s" in cell
    assert "100 slot-s" in row.split('data-col="wasted"', 1)[1].split("</td>", 1)[0]
    kpi = client.get("/ops/bills/", {"period": "day", "first": DAY.isoformat(), "last": DAY.isoformat()}
                     ).content.decode().split('id="kpi-wasted"', 1)[1].split("</div>", 1)[0]
    assert "Not in it: 1 task tco's infrastructure failed ($0.00, 80 slot-s), on this bill all the same." in kpi


#: (state, failed code, exit status, runner record, infrastructure?): the cases the rule tells apart.
NEVER = {"flags": ["proxy_error"], "requests_path": None, "error": "metering proxy did not start in time"}
CASES = [
    ("failed", 0, 1, NEVER, True),
    ("failed", None, 1, NEVER, True),                                               # no accounting code yet
    ("failed", 0, 1, {"flags": ["proxy_error"], "error": "x"}, True),               # version 1: no requests_path
    ("failed", 0, 1, {**NEVER, "flags": ["output_incomplete", "proxy_error"]}, True),
    ("failed", 0, 1, {**NEVER, "requests_path": "/spool/records/1/3.requests.jsonl"}, False),   # it listened
    ("failed", 0, 143, {**NEVER, "flags": ["proxy_error", "runner_signalled"]}, False),
    ("failed", 0, 137, {**NEVER, "flags": ["proxy_error", "memory_limit"]}, False),  # a limit: kind "limit"
    ("failed", 100, 137, NEVER, False),                                              # deleted: kind "ended"
    ("failed", 0, 1, {**NEVER, "flags": ["proxy_errors"]}, False),                  # another flag's name
    ("failed", 0, 1, {**NEVER, "flags": []}, False),
    ("done", 0, 0, NEVER, False),
    ("failed", 19, 0, None, True),                                                  # the host was lost
    ("failed", 0, 70, None, True),                                                  # the runner left no record
    ("failed", 0, 70, {"flags": []}, False),
    ("lost", None, None, None, True),
    ("failed", 0, 3, None, False),
]


def test_the_database_rule_and_failure_of_agree_on_whose_failure_it_is(research, ops_users):
    """``infrastructure_filter`` (the waste rollups' SQL) against ``failure_of`` (Python), case by case,
    and each against the answer written in CASES."""
    c = make_campaign(team=research, user=ops_users["launcher"], name="rule", count=len(CASES))
    for number, (state, code, status, record, _) in enumerate(CASES, start=1):
        Task.objects.create(cluster=c.cluster, campaign=c, job_number=c.job_number, task_number=number, name="rule",
                            state=state, active=False, failed_code=code, exit_status=status, host=HOST,
                            runner_record=record)
    by_sql = set(Task.objects.filter(campaign=c).filter(failures.infrastructure_filter())
                 .values_list("task_number", flat=True))
    for number, (state, code, status, record, expected) in enumerate(CASES, start=1):
        found = failures.failure_of(state=state, failed_code=code, exit_status=status, host=HOST, runner=record)
        assert (found is not None and found.infrastructure) == expected, CASES[number - 1]
        assert (number in by_sql) == expected, CASES[number - 1]
