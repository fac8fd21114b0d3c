"""OCS/GCS 9 flexible accounting of tco's token totals (issue 12, item 3).

Chain: the runner writes ``tco_<key>=<n>`` lines to ``<task>.usage``; the usage epilog
(execution/usage_epilog.py) appends them to the shepherd's usage file; with ``reporting_params
usage_patterns=tco:tco_*`` OCS puts them into the accounting record's ``usage.tco`` object
(sge_conf(5) of OCS 9, ``usage_patterns``; GRIDENGINE.md section 2); ingest keeps them as
``AccountingRecord.tokens`` and checks them against the runner record's totals.

What is real and what is documented: the OCS 9.1.4 captures (tests/fixtures/ocs914, a cell with
``reporting_params accounting=true reporting=true flush_time=... joblog=true ...``, no
``usage_patterns``) carry **no** flexible-accounting group: their ``tco_`` strings are a job name
(``tco_adapter_test``, jobs 22) and a job context (``-ac tco_campaign=17``), not usage values.
The tests on them check that nothing is invented from them. The ``usage.tco`` records below are a
real captured record (job 17) with the group added in the shape sge_conf(5) documents (JSON
numbers; qacct <= 9.1 reads them as doubles); they are labelled as such.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.ocs914 import captured_records, job17_line, with_tco_group

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ocs914"


def test_ingesting_the_captured_file_stores_no_tokens_and_flags_nothing(ocs9_cluster):
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import AccountingRecord, Task

    shutil.copy(CAPTURES / "accounting.jsonl", ocs9_cluster.accounting_path)
    assert ingest_accounting(ocs9_cluster).accepted == 253
    tokens = list(AccountingRecord.objects.values_list("tokens", flat=True))
    assert len(tokens) == 253 and all(t == {} for t in tokens)
    assert not Task.objects.exclude(accounting_check=None).exists()


@pytest.mark.parametrize("metered, status", [(1150, "differs"), (1200, "confirmed")])
def test_ingest_stores_the_tokens_and_checks_them_against_the_runner_record(ocs9_cluster, metered, status):
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import AccountingRecord, Task

    record = job17_line()
    task = _task_for(ocs9_cluster, record, {"input_tokens": metered, "output_tokens": 85, "requests": 3})
    Path(ocs9_cluster.accounting_path).write_bytes(
        with_tco_group(record, {"tco_requests": 3.0, "tco_input_tokens": 1200.0, "tco_output_tokens": 85.0}) + b"\n")
    assert ingest_accounting(ocs9_cluster).accepted == 1
    stored = AccountingRecord.objects.get(cluster=ocs9_cluster)
    assert stored.task_id == task.pk
    assert stored.tokens == {"input_tokens": 1200, "output_tokens": 85}
    task = Task.objects.get(pk=task.pk)
    assert task.accounting_check["status"] == status
    if status == "differs":
        assert task.accounting_check["message"] == "accounting says 1,200 input tokens, metering 1,150"


def test_a_runner_record_read_after_the_accounting_record_is_checked_then(ocs9_cluster):
    from dashboards.ingest.accounting import check_accounting_tokens, ingest_accounting
    from dashboards.models import Task

    record = job17_line()
    task = _task_for(ocs9_cluster, record, None)
    Path(ocs9_cluster.accounting_path).write_bytes(
        with_tco_group(record, {"tco_input_tokens": 1200.0}) + b"\n")
    ingest_accounting(ocs9_cluster)
    assert Task.objects.get(pk=task.pk).accounting_check is None  # nothing to compare yet
    Task.objects.filter(pk=task.pk).update(runner_record={"usage": {"input_tokens": 1150}})
    assert check_accounting_tokens([task.pk]) == 1
    assert Task.objects.get(pk=task.pk).accounting_check["status"] == "differs"
    assert check_accounting_tokens([task.pk]) == 0  # unchanged: not written again


def test_the_agent_page_and_the_cluster_card_show_it(ocs9_cluster, django_user_model):
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import Task
    from dashboards.live.queue import queue_summary
    from dashboards.live.task import task_detail

    record = job17_line()
    task = _task_for(ocs9_cluster, record, {"input_tokens": 1150})
    Path(ocs9_cluster.accounting_path).write_bytes(with_tco_group(record, {"tco_input_tokens": 1200.0}) + b"\n")
    ingest_accounting(ocs9_cluster)
    admin = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    detail = task_detail(admin, Task.objects.get(pk=task.pk).pk, with_scheduler=False)
    assert detail["task"]["accounting_check"]["message"] == "accounting says 1,200 input tokens, metering 1,150"
    (card,) = [c for c in queue_summary(admin)["clusters"] if c["name"] == "ocs914"]
    assert (card["flavour"], card["accounting_path"]) == ("ocs9", ocs9_cluster.accounting_path)


def test_ingesting_the_runner_record_after_the_accounting_record_flags_the_task(ocs9_cluster, tmp_path,
                                                                              django_user_model):
    """The other order, through ingest_runner_records: job 22 task 1 of the captures (an array task)."""
    import datetime as dt

    from django.utils import timezone

    from dashboards.core.bulk import EPOCH
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.ingest.runner_records import ingest_runner_records
    from dashboards.models import AgentDefinition, Campaign, Task
    from dashboards.core.accounts import team_ensure

    (record,) = [r for r in captured_records("accounting.jsonl") if (r["job_number"], r["task_number"]) == (22, 1)]
    team = team_ensure(name="research", project="research")
    user = django_user_model.objects.create_user("launcher")
    agent = AgentDefinition.objects.create(name="a", command=["true"])
    campaign = Campaign.objects.create(name="c", cluster=ocs9_cluster, team=team, agent_definition=agent,
                                       launched_by=user, queue="agent.q", task_count=5, launched_at=timezone.now(),
                                       job_number=22)
    task = Task.objects.create(cluster=ocs9_cluster, campaign=campaign, job_number=22, task_number=1, is_array=True,
                               state="running", submitted_at=EPOCH + dt.timedelta(microseconds=record["submission_time"]))
    Path(ocs9_cluster.accounting_path).write_bytes(
        with_tco_group(record, {"tco_input_tokens": 1200.0, "tco_output_tokens": 85.0}) + b"\n")
    assert ingest_accounting(ocs9_cluster).accepted == 1
    assert Task.objects.get(pk=task.pk).accounting_check is None
    spool = tmp_path / "spool"
    path = spool / "records" / str(campaign.pk) / "1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 2, "campaign_id": campaign.pk, "task_number": 1, "job_number": 22,
                                "stages": {"task_started_at": "2026-12-01T12:23:36.6Z"}, "exit_status": 0,
                                "usage": {"requests": 3, "input_tokens": 1150, "output_tokens": 85}}))
    assert ingest_runner_records(ocs9_cluster, spool=spool).ingested == 1
    check = Task.objects.get(pk=task.pk).accounting_check
    assert check["status"] == "differs"
    assert check["message"] == "accounting says 1,200 input tokens, metering 1,150"


def _task_for(cluster, record: dict, runner_usage: dict | None):
    import datetime as dt

    from dashboards.core.bulk import EPOCH
    from dashboards.models import Task

    submitted = EPOCH + dt.timedelta(microseconds=record["submission_time"])
    return Task.objects.create(cluster=cluster, job_number=record["job_number"], task_number=0,
                               state="running", active=True, submitted_at=submitted,
                               runner_record={"usage": runner_usage} if runner_usage is not None else None)


@pytest.fixture
def ocs9_cluster(db, tmp_path):
    from dashboards.models import Cluster

    common = tmp_path / "default" / "common"
    common.mkdir(parents=True)
    return Cluster.objects.create(name="ocs914", flavour="ocs9", sge_root=str(tmp_path), sge_cell="default",
                                  accounting_path=str(common / "accounting.jsonl"))
