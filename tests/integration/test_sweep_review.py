"""The sweep-and-review demo on the real dev cluster, small: 8 sweep runs, 8 sandboxed reviews.

The sweep (demo/demo_sweep.py) runs as a plain array job on classic.q; the
review campaign (demo/review_agent.py) follows on agent.q, chained with
-hold_jid_ad. The model is the scripted stand-in (demo/demo_model.py
--script review), started here on loopback: the agreement checked below is
the plumbing's, not a model's quality.
"""
from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Task
from dashboards.launch.submit import campaign_submit
from demo.sweep import review_agreement, sweep_review_launch, sweep_submit
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.runner_records import ingest_runner_records
from demo.reference_checker import SCRIPTED_CAVEAT, check_file
from tests.support.sweep_review import prepare_sweep_review

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
N = 8
# demo/demo_sweep.py's eight parameter sets: ok ok diverged ok crashed diverged ok aborted.
REFERENCE = ["ok", "ok", "bad", "ok", "bad", "bad", "ok", "bad"]
# The scripted model answers "bad" only when the run's log says diverged or crashed; the
# aborted run (8) says nothing, so the model calls it ok and the reference does not.
AGENT = ["ok", "ok", "bad", "ok", "bad", "bad", "ok", "ok"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accounting(job_number: int) -> dict[int, list[str]]:
    """task number -> fields of its accounting line (SGE 8 colon format), read here directly."""
    found = {}
    for raw in Path(cluster_get_default().accounting_path).read_text(errors="replace").splitlines():
        fields = raw.split(":")
        if not raw.startswith("#") and len(fields) > 35 and fields[5] == str(job_number):
            found[int(fields[35])] = fields
    return found


def served(model_url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"{model_url}/_stand_in/served", timeout=10) as resp:
        return json.loads(resp.read())




def test_a_sweep_and_its_chained_review_campaign(bootstrap, django_user_model, stand_in_model, runs_dir, settings):
    setting = prepare_sweep_review(settings, django_user_model, stand_in_model, runs_dir)
    cluster, team, admin, runs, scheduler = setting.cluster, setting.team, setting.admin, setting.runs, \
        setting.scheduler

    sweep_job, tasks = sweep_submit(team=team, count=N, out_dir=runs, name="itsweep", scheduler=scheduler)
    assert tasks == list(range(1, N + 1))
    campaign = sweep_review_launch(user=admin, team=team, sweep_job=sweep_job, runs_dir=runs, count=N,
                                   endpoint="demo-stand-in", name="itreview")
    campaign = campaign_submit(campaign_id=campaign.pk, scheduler=scheduler)
    assert campaign.status == "submitted", campaign.submit_error
    review_job = campaign.job_number
    detail = subprocess.run(["qstat", "-j", str(review_job)], capture_output=True, text=True).stdout
    assert any("predecessor" in line and str(sweep_job) in line for line in detail.splitlines()), detail

    # The sweep's runs share classic.q's 2 slots, the reviews start as each run ends.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        apply_qstat_poll(cluster, scheduler.list_tasks(), observed_at=timezone.now())
        ingest_accounting(cluster)
        ingest_runner_records(cluster)
        if Task.objects.filter(campaign=campaign, teardown_done_at__isnull=False).count() == N \
                and len(accounting(sweep_job)) == N:
            break
        time.sleep(0.5)
    else:
        states = list(Task.objects.filter(campaign=campaign).values_list("task_number", "state", "teardown_done_at"))
        queue = subprocess.run(["qstat", "-f", "-q", "classic.q"], capture_output=True, text=True).stdout
        pytest.fail(f"the reviews did not finish in time: {states}; sweep tasks accounted: "
                    f"{sorted(accounting(sweep_job))}; classic.q (state 'a' = load alarm):\n{queue}")

    # The sweep ran as a plain job on classic.q; some runs crashed or diverged, as designed.
    sweep_rows = accounting(sweep_job)
    assert {f[0] for f in sweep_rows.values()} == {"classic.q"}
    assert [int(sweep_rows[n][12]) for n in range(1, N + 1)] == [0, 0, 0, 0, 1, 0, 0, 134]
    assert [check_file(str(runs / f"run-{n}.txt"))[0] for n in range(1, N + 1)] == REFERENCE

    # -hold_jid_ad: review task N started only after sweep task N had ended.
    for task in Task.objects.filter(campaign=campaign).order_by("task_number"):
        sweep_end = int(sweep_rows[task.task_number][10])
        assert task.task_started_at.timestamp() >= sweep_end, task.task_number

    # Every verdict went through the proxy: one metered request per task, answered by the model,
    # which received the key from the proxy (the agents never had it).
    for task in Task.objects.filter(campaign=campaign).order_by("task_number"):
        record = task.runner_record
        assert record["exit_status"] == 0 and record["flags"] == [], (task.task_number, record)
        assert record["sandbox"]["runtime"] == "bubblewrap"
        assert record["usage"]["forwarded"] == 1 and record["usage"]["refused"] == 0
        assert task.input_tokens > 0 and task.output_tokens > 0
        transcript = [json.loads(line) for line in
                      Path(next(o["path"] for o in record["outputs"] if o["name"] == "transcript.jsonl"))
                      .read_text().splitlines()]
        assert [e["type"] for e in transcript] == ["tool_call", "model_call"]
        assert transcript[0]["name"] == "read_run_output"
    model = served(stand_in_model)
    assert model["totals"]["requests"] == N and model["rejected"] == {}
    # The bill is what the model served: every bucket, summed over the tasks' records.
    tasks = Task.objects.filter(campaign=campaign)
    for bucket in ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
                   "output_tokens"):
        assert sum(getattr(t, bucket) for t in tasks) == model["totals"][bucket], bucket
    assert sum(1 for r in model["per_request"] if r.get("stream")) == N // 2  # both paths were metered

    result = review_agreement(campaign=campaign, runs_dir=runs)
    assert [r["agent"] for r in result["rows"]] == AGENT
    assert [r["reference"] for r in result["rows"]] == REFERENCE
    assert (result["agreed"], result["total"], result["agreement"]) == (7, 8, 7 / 8)
    assert result["rows"][7]["reason"] == "no_summary" and result["caveat"] == SCRIPTED_CAVEAT
    assert list(Task.objects.filter(campaign=campaign).order_by("task_number").values_list("verdict", flat=True)) \
        == AGENT
