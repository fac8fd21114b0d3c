"""The seed replay command (issue 15) at a tiny scale on the real dev cluster.

Runs ``manage.py tco_replay_seed --agents 6 --sweep 5 --work-scale 0.05
--submit-here`` (two teams' demo agents, an urgent agent, a 5-run sweep with
chained review agents talking to the scripted stand-in model), then checks
the report's figures against values computed here from the run's own records:
the runner records' stage timestamps (read from the stored JSON, not the
columns the command uses), the campaigns' launch and DRMAA times, and the bill
beside ``qacct -P`` run here.
"""
from __future__ import annotations

import datetime as dt
import io
import re
import statistics
import subprocess

import pytest
from django.core.management import call_command

from dashboards.core.clusters import cluster_get_default
from dashboards.management.commands.tco_bootstrap import demo_ceiling
from dashboards.models import Campaign, ModelEndpoint, PolicyCeiling, Task
from demo.sweep import write_demo_credential
from tests.support.stand_in import KEY

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def stage(record: dict, name: str) -> dt.datetime:
    return dt.datetime.fromisoformat(record["stages"][name].replace("Z", "+00:00"))


def report_row(report: str, label: str) -> list[str]:
    line = next(line for line in report.splitlines() if line.startswith(label))
    return line[len(label):].split()


def test_the_replay_reports_figures_of_its_own_run_and_a_bill_equal_to_qacct(bootstrap, stand_in_model, runs_dir,
                                                                             settings):
    state_dir = runs_dir
    settings.STATE_DIR = state_dir
    port = int(stand_in_model.rsplit(":", 1)[1])
    ModelEndpoint.objects.filter(name="demo-stand-in").update(port=port)
    settings.TCO_DEMO_MODEL_PORT = port
    for ceiling in PolicyCeiling.objects.select_related("team"):
        ceiling.policy = demo_ceiling(project=ceiling.team.project)
        ceiling.save(update_fields=["policy"])
    write_demo_credential(name="demo-stand-in", secret=KEY)
    out = io.StringIO()
    started = dt.datetime.now(dt.timezone.utc)
    call_command("tco_replay_seed", "--agents", "6", "--sweep", "5", "--work-scale", "0.05", "--submit-here",
                 "--no-live",
                 "--timeout", "600", "--out-dir", str(state_dir / "report"), stdout=out, stderr=io.StringIO())
    report = out.getvalue()
    assert (state_dir / "report" / "report.txt").read_text() in report
    html = (state_dir / "report" / "running.html").read_text()
    assert "cdn.plot.ly" not in html and (state_dir / "report" / "plotly.min.js").exists()

    teams = list(Campaign.objects.filter(name__in=["replay-research", "replay-engineering"]).order_by("pk"))
    review = Campaign.objects.get(name="replay-review")
    assert [c.task_count for c in teams] == [3, 3]
    team_tasks = list(Task.objects.filter(campaign__in=teams))
    review_tasks = list(Task.objects.filter(campaign=review))
    assert len(review_tasks) == 5 and all(t.runner_record for t in team_tasks + review_tasks)

    # Stage medians, from the runner records' JSON and the scheduler's submission times.
    def med(values):
        return f"{statistics.median(values):.3f}"

    sandbox_teams = med([(stage(t.runner_record, "sandbox_ready_at") - stage(t.runner_record, "sandbox_create_at"))
                         .total_seconds() for t in team_tasks])
    work_review = med([(stage(t.runner_record, "agent_exited_at") - stage(t.runner_record, "agent_started_at"))
                       .total_seconds() for t in review_tasks])
    queue_review = med([(stage(t.runner_record, "task_started_at") - t.submitted_at).total_seconds()
                        for t in review_tasks])
    submit_teams = med([(c.submitted_at - c.launched_at).total_seconds() for c in teams])
    assert report_row(report, "starting the sandbox")[3] == sandbox_teams
    assert report_row(report, "the agent's own work")[1] == work_review
    assert report_row(report, "waiting in the queue")[1] == queue_review
    assert report_row(report, "submitting the job (launch -> DRMAA)")[1:4:2] == [
        f"{(review.submitted_at - review.launched_at).total_seconds():.3f}", submit_teams]
    # The demo agents' work, as the inputs asked (median 21.9 x 0.05 = 1.1 s), took at least that.
    agent_work = statistics.median((stage(t.runner_record, "agent_exited_at")
                                    - stage(t.runner_record, "agent_started_at")).total_seconds() for t in team_tasks)
    assert 1.0 <= agent_work < 10

    # The running table: from the runner records, peak per team as counted here.
    spans = [(t.project, stage(t.runner_record, "task_started_at"), stage(t.runner_record, "teardown_done_at"))
             for t in team_tasks]
    peak = max(sum(1 for _, a, b in spans if a <= s < b) for _, s, _ in spans)
    assert f"most running at once: {peak}" in report or f"most running at once: {peak + 1}" in report

    # Run 2: 5 runs, run 5 crashed (demo_sweep's parameter sets), the scripted model finds it.
    assert re.search(r"agreement with the deterministic reference: 5/5 \(100%", report), report
    assert "crashed runs found: 1 of 1" in report and "PLUMBING with a scripted stand-in" in report

    # The bill: each team's wall clock equals qacct -P run here over the same day(s).
    first = started.date()
    begin = dt.datetime.combine(first, dt.time(), dt.timezone.utc)
    end = dt.datetime.combine(dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1), dt.time(),
                              dt.timezone.utc) - dt.timedelta(seconds=1)
    accounting = cluster_get_default().accounting_path
    for project in ("research", "engineering"):
        qacct = subprocess.run(["qacct", "-f", accounting, "-P", project, "-b", begin.strftime("%Y%m%d%H%M.%S"),
                                "-e", end.strftime("%Y%m%d%H%M.%S")], capture_output=True, text=True,
                               env={"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default", "TZ": "UTC",
                                    "PATH": "/usr/bin:/bin"}, timeout=120)
        assert qacct.returncode == 0, qacct.stderr
        theirs = next(float(line.split()[1]) for line in qacct.stdout.splitlines()
                      if line.split() and line.split()[0] == project)
        row = next(line.split() for line in report.splitlines() if line.split()[:1] == [project])
        assert (float(row[1]), float(row[2]), row[3]) == (round(theirs), round(theirs), "yes"), (row, theirs)
