"""A launch's sandbox policy: validated with the runner's own loader, then against the admins' ceilings
(``PolicyCeiling``) and the registered model endpoints (``ModelEndpoint``)."""
from __future__ import annotations

from django.conf import settings
from django.db.models import Q

from dashboards.core import limits
from dashboards.core.errors import LaunchError
from dashboards.launch import spool as launch_spool
from dashboards.models import AgentDefinition, ModelEndpoint, PolicyCeiling, Team
from execution.sandbox.ceiling import narrowing_problems
from execution.sandbox.policy import Policy, PolicyError, load_policy


def validate_policy(text: str) -> str:
    """Check a sandbox policy with the runner's own validator (execution/sandbox/policy.py):
    OpenShell's schema, no unknown fields, no duplicate keys, nothing bubblewrap would have to
    enforce less strictly, no more than ``limits.POLICY_MAX_BYTES``.

    Returns the text stripped ("" for none). Raises LaunchError with every problem, also for
    YAML that nests too deeply or has non-text keys (never a 500).
    """
    text = (text or "").strip()
    if not text:
        return ""
    if len(text.encode("utf-8", "surrogatepass")) > limits.POLICY_MAX_BYTES:
        raise LaunchError(f"sandbox policy is larger than {limits.POLICY_MAX_BYTES // 1024} KB")
    _load(text)
    return text


def _load(source: str | dict) -> Policy:
    """``load_policy`` on YAML text (never read as a file name) or a mapping, refusals included.
    Raises LaunchError."""
    if isinstance(source, str) and "\n" not in source:
        source = source + "\n"  # a one-line text is a policy, not a path to one
    try:
        policy = load_policy(source)
    except PolicyError as exc:
        raise LaunchError("sandbox policy: " + "; ".join(exc.problems)) from None
    except (RecursionError, MemoryError):
        raise LaunchError("sandbox policy: nests too deeply to be read") from None
    refused_fields = policy.refusals()
    if refused_fields:
        raise LaunchError("sandbox policy: bubblewrap cannot enforce " + "; ".join(str(f) for f in refused_fields))
    return policy


def effective_policy(text: str) -> Policy:
    """The policy a campaign runs under: ``text``, or the runner's default policy when blank.
    Raises LaunchError."""
    if text:
        return _load(text)
    from execution.runner import default_policy

    return _load(default_policy())


def sandbox_bind_problems(policy: Policy) -> list[str]:
    """Every reason the runner would refuse ``policy`` at run time (issue 11, findings 2, 4, 8):
    binds of tco's masked paths (the spool, credentials and prices files, the state directory
    but for its shared folders), ``/proc``, ``/dev``, other tasks' scratch space, what the
    sandbox cannot enforce, and a relay interpreter (``TCO_RUNNER_PYTHON``) it does not show. The runner's own check (``execution.sandbox.checks.refusals``)
    with the values the runner gets from the job's environment
    (:func:`services.campaign_job_spec`), so a launch is refused exactly when the runner would
    refuse it."""
    from execution.sandbox.checks import refusals, runner_masked_paths

    return refusals(policy, masked_paths=runner_masked_paths(spool=str(settings.TCO_SPOOL_DIR)),
                    state_paths=launch_spool.sandbox_state_paths(), shared_paths=launch_spool.sandbox_shared_paths(),
                    interpreter=str(settings.TCO_RUNNER_PYTHON))


def ceilings_for(team: Team, agent_definition: AgentDefinition) -> list[tuple[str, Policy]]:
    """``[(label, ceiling policy)]`` for the team and the agent definition; the runner's default
    policy (labelled so) when the admins set neither. Raises LaunchError for a ceiling that no
    longer validates (an admin must fix it)."""
    rows = PolicyCeiling.objects.filter(Q(team=team) | Q(agent_definition=agent_definition))
    out = []
    for row in rows:
        label = f"team {team.name}" if row.team_id else f"agent {agent_definition}"
        try:
            out.append((label, load_policy(row.policy + ("\n" if "\n" not in row.policy else ""))))
        except PolicyError as exc:
            raise LaunchError(f"the policy ceiling of {label} is not valid (ask an admin): "
                              + "; ".join(exc.problems)) from None
    if not out:
        from execution.runner import default_policy

        out.append(("the default policy (no ceiling registered)", load_policy(default_policy())))
    return out


def endpoints_for(policy: Policy, *, chosen: str = "") -> tuple[list[ModelEndpoint], ModelEndpoint | None]:
    """The registered endpoints ``policy`` reaches (host and port of one of its endpoints), and
    the one named ``chosen``. Raises LaunchError for a policy endpoint that binds a credential
    but is not registered (or names another provider), and for a ``chosen`` it does not reach."""
    registered = list(ModelEndpoint.objects.filter(active=True))
    used: dict[int, ModelEndpoint] = {}
    for rule, endpoint in policy.endpoints():
        for port in endpoint.ports:
            match = next((m for m in registered if endpoint.host and m.host.lower() == endpoint.host.lower()
                          and m.port == port), None)
            if match is not None and rule.binaries and endpoint.protocol == "rest":
                used[match.pk] = match
            if endpoint.credential_provider is None:
                continue
            if match is None:
                raise LaunchError(f"sandbox policy: {endpoint.where} binds a credential to {endpoint.host}:{port}, "
                                  "which is not a registered model endpoint (an admin registers endpoints)")
            if match.provider != endpoint.credential_provider:
                raise LaunchError(f"sandbox policy: {endpoint.where} binds provider "
                                  f"{endpoint.credential_provider!r}; the registered endpoint {match.name} is "
                                  f"{match.provider!r}")
    endpoints = sorted(used.values(), key=lambda m: m.name)
    selected = None
    if chosen:
        selected = next((m for m in endpoints if m.name == chosen), None)
        if selected is None:
            raise LaunchError(f"model endpoint {chosen!r} is not a registered endpoint the sandbox policy reaches")
    return endpoints, selected


def check_policy(policy_text: str, team: Team, agent_definition: AgentDefinition, *,
                 model_endpoint: str = "") -> tuple[str, list[ModelEndpoint], ModelEndpoint | None]:
    """The launch's whole policy check: the runner's validator, the sandbox's bind check
    (:func:`sandbox_bind_problems`), every ceiling, the registered endpoints. Returns
    ``(policy text, endpoints reached, chosen endpoint)``. Raises LaunchError."""
    text = validate_policy(policy_text)
    policy = effective_policy(text)
    problems = sandbox_bind_problems(policy)
    for label, ceiling in ceilings_for(team, agent_definition):
        problems += [f"{p} (ceiling: {label})" for p in narrowing_problems(policy, ceiling)]
    if problems:
        raise LaunchError("sandbox policy wider than allowed: " + "; ".join(problems))
    endpoints, chosen = endpoints_for(policy, chosen=model_endpoint)
    return text, endpoints, chosen
