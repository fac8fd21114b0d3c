"""Setting up the sweep-and-review demo on the dev cluster for a test (tests/integration)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ReviewSetting:
    """What a sweep-and-review test works with: the ``cluster``, ``team`` (research), ``admin`` user,
    the sweep's ``runs`` directory, the stand-in model's ``port`` and the cluster's ``scheduler``."""

    cluster: object
    team: object
    admin: object
    runs: Path
    port: int
    scheduler: object


def prepare_sweep_review(settings, user_model, stand_in_model: str, runs_dir: Path) -> ReviewSetting:
    """Point the demo at the test's stand-in model (``stand_in_model``: its URL) and state directory
    (``runs_dir``, outside the host's /tmp): its registered endpoint on the stand-in's port, the demo
    ceiling for research, the stand-in's credential in the spool."""
    from dashboards.core.clusters import cluster_get_default, scheduler_for
    from dashboards.launch.spool import team_sweeps_dir
    from dashboards.management.commands.tco_bootstrap import demo_ceiling
    from dashboards.models import ModelEndpoint, PolicyCeiling, Team
    from demo.sweep import write_demo_credential
    from tests.support.stand_in import KEY

    cluster = cluster_get_default()
    team = Team.objects.get(project="research")
    admin = user_model.objects.get(username="admin")
    # tco's state dir for this test lies outside the host's /tmp; its sweeps/ is where the demo
    # ceiling lets review agents read (TCO_SANDBOX_SHARED), everything else in it stays masked.
    settings.STATE_DIR = runs_dir
    runs = team_sweeps_dir(team.project) / "runs"
    # The stand-in listens on a free port: register it there, and the demo ceiling with it.
    port = int(stand_in_model.rsplit(":", 1)[1])
    settings.TCO_DEMO_MODEL_PORT = port
    ModelEndpoint.objects.filter(name="demo-stand-in").update(port=port)
    PolicyCeiling.objects.filter(team=team).update(policy=demo_ceiling(project=team.project))
    write_demo_credential(name="demo-stand-in", secret=KEY)
    return ReviewSetting(cluster, team, admin, runs, port, scheduler_for(cluster))
