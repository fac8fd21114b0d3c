"""The web side of the spool contract: launch writes the spec through it; stage statistics and spool reads."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest

from dashboards.core import spool_files
from dashboards.core import errors
from dashboards.launch.service import LaunchRequest
from dashboards.launch.service import launch as launch_service
from dashboards.core.roles import membership_set
from dashboards.models import AgentDefinition, Campaign, Task, Team
from dashboards.core.stages import quantile
from execution.spool.layout import SpoolLayout
from execution.spool.spec import RunnerSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(bootstrap, django_user_model):
    user = django_user_model.objects.create_user("launcher-spool")
    membership_set(user=user, team=Team.objects.get(project="research"), role="launcher")
    return user


def launch(user, **kwargs):
    return launch_service(user=user, request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        inputs=[{"task": 1}, {"task": 2}], name="spool-test", **kwargs)).campaign


def test_launch_writes_the_outputs_into_the_spec_the_runner_reads(launcher, bootstrap):
    campaign = launch(launcher, outputs=["verdict.json", "*.txt"], model="claude-x", cost_cap_usd=Decimal("0.25"))
    root = Path(bootstrap.TCO_SPOOL_DIR)
    data = json.loads((root / "campaigns" / str(campaign.pk) / "spec.json").read_text())
    assert data["version"] == 1 and data["agent"]["outputs"] == ["verdict.json", "*.txt"]
    assert data["inputs_file"] == str(root / "campaigns" / str(campaign.pk) / "inputs.jsonl")
    spec = RunnerSpec.read(SpoolLayout(root).spec_path(campaign.pk))
    assert (spec.outputs, spec.model, spec.cost_cap_usd) == (["verdict.json", "*.txt"], "claude-x", Decimal("0.25"))
    lines = (root / "campaigns" / str(campaign.pk) / "inputs.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"task": 1}, {"task": 2}]


def test_a_launch_whose_spec_breaks_the_contract_records_nothing(launcher, bootstrap):
    with pytest.raises(errors.LaunchError, match="outputs"):
        launch(launcher, outputs=["/etc/shadow"])
    assert not Campaign.objects.filter(name="spool-test").exists()
    assert list(Path(bootstrap.TCO_SPOOL_DIR).glob("campaigns/*/*")) == []


def test_the_one_quantile_interpolates_between_closest_ranks():
    # numpy.quantile([1, 2, 4, 8], q) with the default "linear" method, by hand.
    assert quantile([1.0, 2.0, 4.0, 8.0], 0.5) == 3.0
    assert quantile([1.0, 2.0, 4.0, 8.0], 0.9) == pytest.approx(4.0 + 0.7 * 4.0)
    assert quantile([5.0], 0.1) == 5.0 and quantile([], 0.5) is None
    assert quantile([Decimal("1.00"), Decimal("2.00")], 0.25) == Decimal("1.25")


def test_spool_paths_of_a_task_follow_the_layout(bootstrap, launcher):
    campaign = launch(launcher)
    task = Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=5, task_number=2,
                               is_array=True, state="running", submitted_at=dt.datetime.now(dt.timezone.utc))
    root = str(bootstrap.TCO_SPOOL_DIR)
    assert spool_files.task_work_dir(task) == f"{root}/work/{campaign.pk}/2"
    assert spool_files.task_output_path(task, "stdout") == f"{root}/records/{campaign.pk}/2.stdout"
    # A non-array job's task number is 0; its runner writes as task 1.
    task.task_number = 0
    assert spool_files.task_work_dir(task) == f"{root}/work/{campaign.pk}/1"
