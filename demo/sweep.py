"""The sweep-and-review demo (the source article's second run, small): writes and reads.

1. :func:`sweep_submit`: a classic parameter sweep (demo/demo_sweep.py) as
   a plain array job on ``classic.q``; no sandbox, no model: a batch job as
   any cluster runs them. Some of its runs diverge or crash on purpose.
2. :func:`sweep_review_launch`: a review campaign on ``agent.q``, one agent
   (demo/review_agent.py) per run, chained with ``-hold_jid_ad`` so review
   task N starts when sweep task N has finished. Each agent reads its run
   through a tool call and asks the model for a verdict through the metering
   proxy; its policy shows it only its own run's directory, read-only.
3. :func:`review_agreement`: the agents' verdicts against the deterministic
   reference checker (demo/reference_checker.py); sets ``Task.verdict``.
   With the scripted stand-in model the figure checks the plumbing, not a
   model's quality (``caveat`` in the result, to be shown with it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from demo.reference_checker import agreement, check_file
from execution.spool.files import write_atomic
from execution.spool.layout import SpoolLayout
from schedulers.base import ArrayJobSpec
from schedulers.gridengine.native_spec import sanitize_name

from dashboards.launch.service import LaunchRequest, launch
from dashboards.management.commands.tco_bootstrap import demo_policy
from dashboards.models import AgentDefinition, Campaign, ModelEndpoint, Task, Team
from dashboards.core import rollups
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.core.errors import LaunchError

REVIEW_AGENT = "sweep-review"
SWEEP_QUEUE = "classic.q"
REVIEW_QUEUE = "agent.q"
DEFAULT_MODEL = "stand-in-review"  # priced by the demo price table (tco_bootstrap)


def _agent_python() -> str:
    """The interpreter the review agents run with inside the sandbox: the base python
    behind tco's venv (the agent needs only the standard library)."""
    return os.path.realpath(settings.TCO_RUNNER_PYTHON)


def sweep_submit(*, team: Team, count: int, out_dir: str | Path, name: str = "sweep", scheduler=None,
                 account: str = "tco") -> tuple[int, list[int]]:
    """Submit the demo sweep: ``count`` tasks of demo/demo_sweep.py on classic.q writing
    ``out_dir/run-<task>.txt``. Returns ``(job_number, task_numbers)``. Raises
    SchedulerCommandError / SchedulerUnavailable / InvalidSubmission."""
    out_dir = Path(out_dir)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    spec = ArrayJobSpec(
        name=sanitize_name(f"tco-sweep-{name}"),
        command=settings.TCO_RUNNER_PYTHON,
        args=["-m", "demo.demo_sweep", "--out", str(out_dir)],
        count=count,
        queue=SWEEP_QUEUE,
        project=team.project,
        resources={},
        environment={"PYTHONPATH": str(settings.BASE_DIR), "PYTHONDONTWRITEBYTECODE": "1"},
        working_directory=str(out_dir),
        output_path=str(out_dir / "logs"),
        error_path=str(out_dir / "logs"),
        account=account,
    )
    cluster = cluster_get_default()
    scheduler = scheduler or scheduler_for(cluster)
    job_number, task_numbers = scheduler.submit_array(spec)
    # Recorded at once (the polls update these rows), so the review campaign may name the
    # sweep as its predecessor: the launch accepts only jobs of a team the launcher sees.
    now = timezone.now()
    Task.objects.bulk_create([Task(cluster=cluster, job_number=job_number, task_number=n, is_array=True,
                                   name=spec.name, owner=settings.TCO_SUBMIT_USER, project=team.project,
                                   state="pending", state_code="qw", submitted_at=now, first_seen_at=now)
                              for n in task_numbers], ignore_conflicts=True)
    return job_number, task_numbers


def review_policy(*, runs_dir: str | Path, endpoint: ModelEndpoint) -> str:
    """The review agents' policy (OpenShell schema): system directories and tco's agent code
    read-only, the sweep's run directory read-only, the work directory and a private /tmp
    writable, and one network rule: POST /v1/messages on the registered model ``endpoint``,
    with the credential bound by its provider (the proxy adds it; the agent never sees it)."""
    read_only = ["/usr", "/lib", "/lib64", "/bin", "/etc", str(Path(settings.BASE_DIR) / "demo"), str(runs_dir)]
    return demo_policy(read_only=read_only, host=endpoint.host, port=endpoint.port, provider=endpoint.provider,
                       landlock=True)


def review_agent_definition() -> AgentDefinition:
    """The review agent's definition (created on first use)."""
    agent, _ = AgentDefinition.objects.get_or_create(
        name=REVIEW_AGENT, version=1,
        defaults={"description": "Reviews one run of the demo sweep through a tool call and the model "
                                 "(demo/review_agent.py).",
                  "command": [_agent_python(), "-m", "demo.review_agent", "{input}", "{workdir}"],
                  "input_kind": "params", "timeout_s": 600, "default_model": DEFAULT_MODEL},
    )
    return agent


def sweep_review_launch(*, user: AbstractBaseUser, team: Team, sweep_job: int, runs_dir: str | Path, count: int,
                        endpoint: str, name: str = "sweep-review", model: str = DEFAULT_MODEL) -> Campaign:
    """Launch the review campaign through the launch service as ``user``: one review agent per
    sweep task, held per task on the sweep (``-hold_jid_ad``), sandboxed by :func:`review_policy`,
    talking to the registered model endpoint named ``endpoint``; each task's verdict and
    transcript are declared outputs. Raises LaunchError, ActionRefused."""
    registered = ModelEndpoint.objects.filter(name=endpoint, active=True).first()
    if registered is None:
        raise LaunchError(f"model endpoint {endpoint!r} is not registered (admin: Model endpoints)")
    # Every other review streams its answer (server-sent events), so both of
    # the proxy's paths carry the demo.
    inputs = [{"sweep_task": n, "run_output": str(Path(runs_dir) / f"run-{n}.txt"), "model": model,
               "stream": n % 2 == 0}
              for n in range(1, count + 1)]
    return launch(user=user, request=LaunchRequest(
        team=team, agent_definition=review_agent_definition(), inputs=inputs, name=name, queue=REVIEW_QUEUE,
        model=model, policy=review_policy(runs_dir=runs_dir, endpoint=registered), model_endpoint=registered.name,
        predecessor_job=sweep_job, outputs=["verdict.json", "transcript.jsonl"], action="sweep_review_launch",
    )).campaign


def _agent_verdict(task: Task) -> str | None:
    record = task.runner_record or {}
    for output in record.get("outputs") or []:
        if output.get("name") == "verdict.json":
            try:
                verdict = json.loads(Path(output["path"]).read_text()).get("verdict")
            except (OSError, ValueError):
                return None
            return verdict if verdict in ("ok", "bad") else None
    return None


def review_agreement(*, campaign: Campaign, runs_dir: str | Path | None = None) -> dict[str, Any]:
    """Compare each finished review task's verdict with the reference checker's; store the
    agent's verdict on the task. ``runs_dir`` defaults to the directory the campaign's inputs
    name. Returns ``{"total", "agreed", "agreement", "caveat", "pending", "rows": [...]}``
    (``rows``: task, agent verdict, reference verdict and reason, agreed; ``pending``: tasks
    without a runner record yet, left out of the figure)."""
    runs = Path(runs_dir) if runs_dir is not None else review_runs_dir(campaign)
    rows, pairs, pending = [], [], 0
    for task in Task.objects.filter(campaign=campaign).order_by("task_number"):
        if not task.runner_record:
            pending += 1
            continue
        agent = _agent_verdict(task)
        reference, reason = check_file(str(runs / f"run-{task.task_number}.txt"))
        if (task.verdict or None) != agent:
            with rollups.tasks_rolled([task.pk]):  # a verdict counts in bills
                Task.objects.filter(pk=task.pk).update(verdict=agent or "")
        rows.append({"task": task.task_number, "agent": agent, "reference": reference, "reason": reason,
                     "agreed": agent == reference})
        pairs.append((agent, reference))
    return {**agreement(pairs), "pending": pending, "rows": rows}


def review_runs_dir(campaign: Campaign) -> Path:
    """The sweep's run directory, as the review campaign's first input names it."""
    inputs = SpoolLayout(settings.TCO_SPOOL_DIR).inputs_path(campaign.pk)
    with open(inputs, encoding="utf-8") as fh:
        return Path(json.loads(fh.readline())["run_output"]).parent


def write_demo_credential(*, name: str, secret: str, spool: Path | None = None) -> Path:
    """Add ``name`` to the runners' credentials file (``<spool>/credentials.json``, mode 0600),
    keeping the names already there. Returns its path."""
    path = Path(SpoolLayout(spool or settings.TCO_SPOOL_DIR).credentials_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        table = json.loads(path.read_text())
    except FileNotFoundError:
        table = {}
    table[name] = secret
    write_atomic(path, json.dumps(table).encode(), mode=0o600)
    return path


__all__ = ["sweep_submit", "review_policy", "review_agent_definition", "sweep_review_launch", "review_agreement",
           "review_runs_dir", "write_demo_credential"]
