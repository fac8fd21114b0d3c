"""What a launch asks for: the :class:`LaunchRequest` the launch service checks and the forecast reads."""
from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any, Sequence

from dashboards.models import AgentDefinition, Campaign, Cluster, Team

#: Declared output files a campaign may keep (paths or globs).
MAX_OUTPUTS = 32


@dataclasses.dataclass
class LaunchRequest:
    """Everything a launch may ask for. Only ``team``, ``agent_definition``, ``inputs`` and
    ``name`` are required; the rest default as a plain campaign.

    ``inputs``: one JSON object per task (task N gets ``inputs[N-1]``).
    ``priority``: qsub ``-p`` (``limits.PRIORITY_MIN`` up to the role's limit).
    ``predecessor_job``: ``-hold_jid_ad`` (a campaign of a team the user sees, same task count).
    ``advance_reservation``: ``-ar`` (a reservation number; refused when tco booked it for another
    team, ``reservations.check_launch_into``). ``concurrency_cap``: ``-tc``.
    ``model``, ``policy`` (YAML): blank takes the agent definition's defaults (the runner's default
    policy when that is blank too). ``model_endpoint``: the *name* of a registered ``ModelEndpoint``
    the metering proxy sends the agent's requests to (it must be an endpoint of the policy).
    ``token_cap`` (tokens per task), ``cost_cap_usd`` (USD per task, Decimal).
    ``outputs``: files of the work directory (relative paths or globs) the runner keeps for the
    pages. ``urgent``: an urgent agent (urgent launchers only). ``retry_of``: the campaign this
    retries. ``rerunnable``: qsub ``-r y`` (a task whose host is lost is rerun on another host after
    the cluster's ``reschedule_unknown``; each attempt keeps its accounting record).
    ``memory_bytes``, ``work_bytes``: the sandbox's memory and work-directory limits per task
    (bytes; None: the site's, ``limits.sandbox_maxima``, which also bounds them; docs/limits.md).
    ``action``: the audit entry's action name.
    """

    team: Team
    agent_definition: AgentDefinition
    inputs: Sequence[dict[str, Any]]
    name: str
    queue: str = "agent.q"
    seats_per_task: int = 1
    concurrency_cap: int | None = None
    priority: int = 0
    urgent: bool = False
    model: str = ""
    policy: str = ""
    model_endpoint: str = ""
    predecessor_job: int | None = None
    advance_reservation: int | None = None
    token_cap: int | None = None
    cost_cap_usd: Decimal | None = None
    outputs: Sequence[str] = ()
    retry_of: Campaign | None = None
    cluster: Cluster | None = None
    rerunnable: bool = False
    memory_bytes: int | None = None
    work_bytes: int | None = None
    action: str = "launch"

    def audit_params(self) -> dict[str, Any]:
        """The request as the audit entry records it (JSON-ready, long text cut)."""
        return {"name": str(self.name)[:100], "team": self.team.project,
                "agent": f"{self.agent_definition.name} v{self.agent_definition.version}",
                "tasks": len(self.inputs), "queue": str(self.queue)[:64], "seats_per_task": self.seats_per_task,
                "concurrency_cap": self.concurrency_cap, "priority": self.priority, "model": str(self.model)[:128],
                "model_endpoint": str(self.model_endpoint)[:64], "predecessor_job": self.predecessor_job,
                "advance_reservation": self.advance_reservation, "token_cap": self.token_cap,
                "cost_cap_usd": str(self.cost_cap_usd) if self.cost_cap_usd is not None else None,
                "outputs": [str(o)[:255] for o in list(self.outputs)[:MAX_OUTPUTS]], "urgent": self.urgent,
                "retry_of": self.retry_of.pk if self.retry_of else None, "rerunnable": self.rerunnable,
                "memory_bytes": self.memory_bytes, "work_bytes": self.work_bytes}

    def sandbox_limits(self) -> dict[str, int]:
        """The runner spec's ``limits`` this request asks for (only those set), bytes."""
        return {key: value for key, value in (("memory_bytes", self.memory_bytes), ("work_bytes", self.work_bytes))
                if value is not None}
