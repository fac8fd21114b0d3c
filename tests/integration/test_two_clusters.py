"""One tco, two real Grid Engine cells (issue 26, docs/clusters.md).

Needs the second cell of the dev cluster and its fault helper, started as root:

    scripts/dev-cluster --cell second --port-base 6544
    SGE_CELL=second SGE_QMASTER_PORT=6544 SGE_EXECD_PORT=6545 scripts/cluster-faults --parent $$ &
    TCO_SECOND_CELL=second:6544:6545 scripts/test tests/integration/test_two_clusters.py

(under ``flock /var/lock/tco-cluster.lock``). Without ``TCO_SECOND_CELL`` it is skipped: the
rest of the suite needs one cell only.

A campaign is launched on each cell (the second one's submitted from another process, as its own
submit worker would: one DRMAA session per process and cell); the worker's periodic tasks poll and
ingest both; the tasks, accounting records and bills are checked against each cell's own qstat
and accounting file (qacct); a team's roles hold on both; then the second cell's qmaster stops:
tco shows that cluster unreachable while the first one goes on, and recovers when it is back.
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from dashboards.billing import bills
from dashboards.core.clusters import cluster_get_default, clusters_watched
from dashboards.core.health import scheduler_unreachable
from dashboards.core.scope import tasks_visible_to
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_submit
from dashboards.models import AgentDefinition, Campaign, Cluster, Task, Team
from tests.support.paths import REPO
from tests.support.stack import database_url_for as database_url
from tests.sge_env import sge_env
from tests.support.cluster import qdel_quietly

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SECOND = os.environ.get("TCO_SECOND_CELL", "")
FAULTS = Path("/run/tco-dev-cluster")


@pytest.fixture
def second(bootstrap) -> Cluster:
    if not SECOND:
        pytest.skip("TCO_SECOND_CELL (name:qmaster port:execd port) names no second cell; see this module's doc")
    name, qmaster, execd = SECOND.split(":")
    env = sge_env(settings.SGE_ROOT, name, SGE_QMASTER_PORT=qmaster, SGE_EXECD_PORT=execd)
    answer = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True, env=env)
    if answer.returncode != 0:
        pytest.fail(f"the second cell does not answer ({answer.stderr.strip()}): scripts/dev-cluster --cell {name} "
                    f"--port-base {qmaster}")
    return Cluster.objects.create(name=name, sge_root=settings.SGE_ROOT, sge_cell=name, flavour="sge8",
                                  accounting_path=os.path.join(settings.SGE_ROOT, name, "common", "accounting"),
                                  qmaster_port=int(qmaster), execd_port=int(execd))


def submit_elsewhere(campaign_id: int) -> None:
    """``campaign_submit`` in a process of its own (its DRMAA session on the campaign's cell)."""
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict["NAME"]),
           "TCO_SPOOL_DIR": str(settings.TCO_SPOOL_DIR), "DJANGO_SETTINGS_MODULE": "tco_web.settings"}
    env.pop("DATABASE_URL_FILE", None)
    code = ("import django; django.setup(); from dashboards.launch.submit import campaign_submit; "
            f"c = campaign_submit(campaign_id={campaign_id}); print(c.status, c.job_number, c.submit_error)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def qacct_wallclock(cluster: Cluster, job: int) -> float:
    """The sum of ``ru_wallclock`` over the job's records in ``qacct -j`` (SGE 8.1.9 prints it "2s")."""
    out = subprocess.run(["qacct", "-j", str(job), "-f", cluster.accounting_path], capture_output=True, text=True,
                         env=sge_env(cluster.sge_root, cluster.sge_cell, TZ="UTC", LC_ALL="C")).stdout
    walls = [line.split()[1].removesuffix("s") for line in out.splitlines() if line.startswith("ru_wallclock")]
    assert walls, out
    return sum(float(w) for w in walls)


def fault(cell: str, request: str) -> None:
    """Ask the cell's fault helper (scripts/cluster-faults, root) for ``request``; wait for it to be done."""
    fifo, log = FAULTS / f"faults-{cell}.fifo", FAULTS / f"faults-{cell}.log"
    if not fifo.exists():
        pytest.fail(f"no fault helper for cell {cell}: SGE_CELL={cell} ... scripts/cluster-faults --parent PID")
    ident = uuid.uuid4().hex[:12]
    with open(fifo, "w") as fh:
        fh.write(f"{ident} {request}\n")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith(ident + " "):
                assert line.endswith(" 0"), line
                return
        time.sleep(0.5)
    pytest.fail(f"the fault helper did not do {request!r} on cell {cell}")


def one_round() -> None:
    """The worker's periodic tasks, as beat runs them, for every cluster."""
    import worker.tasks as tasks

    for cluster in clusters_watched():
        tasks.poll_queue(cluster.name)
        tasks.poll_cluster_status(cluster.name)
    tasks.ingest_accounting()
    tasks.ingest_runner_records()
    tasks.reconcile_gone_tasks()


def test_one_tco_polls_ingests_launches_and_bills_two_cells(second, ops_users, django_user_model):
    first = cluster_get_default()
    assert [c.name for c in clusters_watched()] == [first.name, second.name]
    one_round()  # both polled: their queues, hosts and seats known before a launch is forecast
    for cluster in (first, second):
        cluster.refresh_from_db()
        assert cluster.polled_at and not cluster.poll_error, (cluster.name, cluster.poll_error)
        assert cluster.status.get("queues"), cluster.name
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    launcher = ops_users["launcher"]
    inputs = [{"task": n, "duration_s": 2.0} for n in (1, 2, 3)]
    here = launch(user=launcher, request=LaunchRequest(team=research, agent_definition=agent, inputs=inputs,
                                                       name="two-cells-first", cluster=first)).campaign
    there = launch(user=launcher, request=LaunchRequest(team=research, agent_definition=agent, inputs=inputs,
                                                        name="two-cells-second", cluster=second)).campaign
    assert campaign_submit(campaign_id=here.pk).status == "submitted"
    submit_elsewhere(there.pk)
    here.refresh_from_db()
    there.refresh_from_db()
    assert there.status == "submitted" and there.job_number, there.submit_error
    # The second cell's own qstat lists the job: it went to that cell, not the first.
    listed = subprocess.run(["qstat", "-u", "*", "-xml"], capture_output=True, text=True,
                            env=sge_env(second.sge_root, second.sge_cell, SGE_QMASTER_PORT=str(second.qmaster_port),
                                        SGE_EXECD_PORT=str(second.execd_port))).stdout
    assert f"<JB_job_number>{there.job_number}</JB_job_number>" in listed

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        one_round()
        if not Task.objects.filter(campaign__in=[here, there], active=True).exists() and \
                not Task.objects.filter(campaign__in=[here, there], task_started_at__isnull=True).exists():
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"not ended: {list(Task.objects.filter(active=True).values_list('cluster__name', 'state'))}")
    for campaign, cluster in ((here, first), (there, second)):
        tasks = Task.objects.filter(campaign=campaign)
        assert set(tasks.values_list("cluster_id", flat=True)) == {cluster.pk}
        assert sorted(tasks.values_list("state", flat=True)) == ["done"] * 3
        assert all(t.accounting.filter(cluster=cluster).exists() for t in tasks)
    # Bills: the team's total is both cells', per cluster splits them, each equal to its cell's qacct.
    day = min(Task.objects.filter(campaign__in=[here, there]).values_list("started_at", flat=True)).date()
    span = {"period": "day", "first": day, "last": day + dt.timedelta(days=1)}
    split = bills.bill(teams=[research], group_by="cluster", **span)
    walls = {}
    for row in split["rows"]:
        if row["launched_by_tco"]:
            walls[row["label"]] = walls.get(row["label"], 0.0) + row["wallclock_s"]
    assert walls[first.name] >= qacct_wallclock(first, here.job_number)  # the first cell ran other suites' jobs too
    assert walls[second.name] == pytest.approx(qacct_wallclock(second, there.job_number))
    whole = bills.bill(teams=[research], **span)
    assert whole["totals"]["wallclock_s"] == pytest.approx(sum(walls.values()))
    only_second = bills.bill(teams=[research], clusters=[second], **span)
    assert only_second["totals"]["tasks"] == 3
    # Roles and teams hold on both cells: the research viewer sees both campaigns, engineering's none.
    assert set(tasks_visible_to(ops_users["viewer"]).filter(campaign__in=[here, there])
               .values_list("cluster__name", flat=True)) == {first.name, second.name}
    assert not tasks_visible_to(ops_users["other"]).filter(campaign__in=[here, there]).exists()

    # The second cell stops answering: shown as such, the first goes on.
    fault(second.sge_cell, "qmaster down")
    try:
        before = Cluster.objects.get(pk=first.pk).polled_at
        time.sleep(1.1)
        one_round()
        second.refresh_from_db()
        assert second.poll_error, "a failed poll of the second cell is recorded"
        assert [o.cluster for o in scheduler_unreachable()] == [second.name]
        assert Cluster.objects.get(pk=first.pk).polled_at > before and not Cluster.objects.get(pk=first.pk).poll_error
        # Its tasks keep their last state (none made lost or deleted on a guess).
        assert set(Task.objects.filter(campaign=there).values_list("state", flat=True)) == {"done"}
        from django.test import Client

        client = Client()
        client.force_login(ops_users["viewer"])
        page = client.get("/").content.decode()
        assert f"Scheduler of cluster {second.name} unreachable since" in page
        assert f"Scheduler of cluster {first.name} unreachable" not in page
        # A campaign launched on the first cell while the second is down goes through.
        again = launch(user=launcher, request=LaunchRequest(team=research, agent_definition=agent,
                                                            inputs=inputs[:1], name="while-down", cluster=first))
        assert campaign_submit(campaign_id=again.campaign.pk).status == "submitted"
    finally:
        fault(second.sge_cell, "qmaster up")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        one_round()
        if not Cluster.objects.get(pk=second.pk).poll_error:
            break
        time.sleep(1)
    assert not Cluster.objects.get(pk=second.pk).poll_error and scheduler_unreachable() == []
    # The one-task job launched while the second cell was down has most likely ended by now.
    qdel_quietly(Campaign.objects.get(name="while-down").job_number)
