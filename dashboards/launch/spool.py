"""The campaign's files in the spool: inputs, runner spec, prices, sandbox state paths (execution/spool/)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from django.conf import settings

from dashboards.core.errors import LaunchError
from dashboards.models import Campaign
from execution.spool.contract import SpecError
from execution.spool.files import write_atomic
from execution.spool.layout import SpoolLayout
from execution.spool.spec import ModelEndpoint, RunnerSpec


def spool_dir() -> Path:
    return Path(settings.TCO_SPOOL_DIR)


def spool_layout() -> SpoolLayout:
    """The spool's paths (execution/spool/) under ``TCO_SPOOL_DIR``."""
    return SpoolLayout(settings.TCO_SPOOL_DIR)


def campaign_spool_write(campaign: Campaign, encoded_inputs: Sequence[str], *,
                         model_endpoint: dict[str, str] | None = None, outputs: Sequence[str] = (),
                         model_endpoints: Sequence[ModelEndpoint] = (),
                         network_ceilings: Sequence[dict] = (), limits: dict[str, int] | None = None) -> RunnerSpec:
    """Write a launched campaign's inputs (one JSON text per task) and runner spec into the spool.

    The spec (execution/spool/spec.py ``RunnerSpec``) takes the agent definition,
    model, policy and caps from ``campaign``; only the options that are set
    are written, so a plain launch writes a short spec. ``model_endpoints`` are
    the admin-registered endpoints the campaign may use (the only ones the
    runner's proxy gives a credential to); ``model_endpoint`` the chosen one; ``network_ceilings``
    the network part of each admin ceiling (``{"label", "network_policies"}``: the runner refuses
    a live network policy change wider than one, dashboards/netpolicy.py); ``limits`` the sandbox limits the
    launch asked for (the spec's ``limits``, bytes; the runner takes the smaller of each and the site's). Raises LaunchError
    when the spec would break the contract (nothing is written then), OSError.
    """
    layout = spool_layout()
    agent = campaign.agent_definition
    try:
        spec = RunnerSpec(
            campaign_id=campaign.pk, agent_name=agent.name, agent_version=agent.version, command=agent.command,
            outputs=list(outputs), inputs_file=layout.inputs_path(campaign.pk), timeout_s=agent.timeout_s,
            model=campaign.model or None, policy=campaign.policy or None, token_cap=campaign.token_cap,
            cost_cap_usd=campaign.cost_cap_usd,
            model_endpoint={k: str(v) for k, v in (model_endpoint or {}).items()
                            if k in ("base_url", "credential_name") and v} or None,
            model_endpoints=list(model_endpoints), network_ceilings=list(network_ceilings), limits=dict(limits or {}) or None)
    except SpecError as exc:
        raise LaunchError(f"runner spec: {exc}") from None
    write_atomic(layout.inputs_path(campaign.pk), ("\n".join(encoded_inputs) + "\n").encode())
    try:  # a new campaign runs under its launch policy (version 0), never a leftover change
        os.unlink(layout.network_policy_path(campaign.pk))
    except FileNotFoundError:
        pass
    spec.write(layout.spec_path(campaign.pk))
    return spec


def campaign_spec(campaign: Campaign) -> dict[str, Any]:
    """The runner spec a campaign was launched with (execution/spool/spec.py's JSON), ``{}`` when
    the spool does not have it (or it cannot be read)."""
    path = Path(spool_layout().spec_path(campaign.pk))
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return spec if isinstance(spec, dict) else {}


def prices_write() -> Path | None:
    """Write today's price table to ``<spool>/prices.json`` for the runners.

    The table is the one the launch forecast prices with (``billing.costs.price_table``:
    the admin's Model prices and aliases, and ``TCO_PRICES`` for models they
    lack), so a forecast and the metered cost of the same run use the same
    prices. The runners' metering proxies price each request from this file, in
    execution/metering/prices.py's format; it is rewritten at every launch so a
    campaign is priced as the table stood when it was launched. Returns the
    path, or None when no model has a price (costs are then unknown, never 0).
    """
    from dashboards.billing.costs import price_table

    table = price_table()
    if table is None:
        return None
    mapping = table.to_mapping()
    if not mapping or not any(k != "aliases" for k in mapping):
        return None
    path = Path(spool_layout().prices_path)
    write_atomic(path, json.dumps(mapping, indent=1, default=str).encode())
    return path


def sandbox_state_paths() -> list[str]:
    """tco's state directory and its secrets elsewhere (``TCO_SECRET_PATHS``: ``/etc/tco``, the
    ``*_FILE`` secrets): hidden from every agent (the runner's ``TCO_SANDBOX_MASK``), except
    :func:`sandbox_shared_paths` inside the state directory."""
    paths = [str(settings.STATE_DIR)]
    for path in getattr(settings, "TCO_SECRET_PATHS", ()):
        if path not in paths:
            paths.append(path)
    return paths


def sandbox_shared_paths() -> list[str]:
    """Directories inside the state directory that a policy may list (``TCO_SANDBOX_SHARED``):
    ``<state>/sweeps``, the demo sweep's run outputs its review agents read (each team's under
    :func:`team_sweeps_dir`, the only part its policy ceiling lets it list)."""
    return [str(Path(settings.STATE_DIR) / "sweeps")]


def team_sweeps_dir(project: str) -> Path:
    """``<state>/sweeps/<project>``: where a team's demo sweeps write their runs, and all of the
    sweeps its demo policy ceiling lets its agents read (another team's stay out of reach).
    Raises ValueError for a project name that is not one path component."""
    if not project or "/" in project or project in (".", ".."):
        raise ValueError(f"project {project!r}: not a directory name")
    return Path(settings.STATE_DIR) / "sweeps" / project


def campaign_inputs(campaign: Campaign) -> list[dict[str, Any]]:
    """The campaign's inputs as written at launch (task N is item N-1). Raises LaunchError if unreadable."""
    path = Path(spool_layout().inputs_path(campaign.pk))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise LaunchError(f"the inputs of campaign {campaign.pk} cannot be read: {exc.strerror}") from None
    return [json.loads(line) for line in lines if line.strip()]
