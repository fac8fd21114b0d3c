"""Which policies the runner refuses, as one pure function both the runner and the launch form call.

:func:`refusals` returns every reason the runner would refuse a policy at run
time, so that the launch side refuses the same policies before anything is
submitted (issue 11, finding 8). The runner calls it before it builds the
sandbox, and the bubblewrap argv builder (:mod:`execution.sandbox.bwrap`)
asks :func:`~execution.sandbox.paths.path_refusal` again for each listed
path, so no path the function lets through is bound differently. What a
listed path may not be: execution/sandbox/paths.py. The relay's interpreter
is checked by the argv builder itself, run on a stand-in plan.

Standard library only (the runner imports it on every task).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from execution.sandbox.bwrap import SandboxConfigError, build_argv
from execution.sandbox.paths import CODE_ROOT, INSIDE_RELAY, HostFS, path_refusal, resolve_masks
from execution.sandbox.plan import HiddenPaths, SandboxFds, SandboxPlan

__all__ = ["refusals", "runner_masked_paths"]


def runner_masked_paths(*, spool: str, credentials_file: str | None = None,
                        prices_file: str | None = None) -> list[str]:
    """The host paths the runner hides from every agent with no exception, apart from its
    private directories (host-specific; the runner adds them): the spool and the
    credentials and price files (defaults ``<spool>/credentials.json`` and
    ``<spool>/prices.json``). The launch side passes the same values (its settings) to
    :func:`refusals`, with tco's state directory as ``state_paths``."""
    out: list[str] = []
    for path in (spool, credentials_file or os.path.join(spool, "credentials.json"),
                 prices_file or os.path.join(spool, "prices.json")):
        if path and os.path.isabs(path) and os.path.normpath(path) not in out:
            out.append(os.path.normpath(path))
    return out


def refusals(policy: Any, *, masked_paths: Iterable[str], state_paths: Iterable[str] = (),
             shared_paths: Iterable[str] = (), runtime: str = "bubblewrap",
             registered: Iterable[Mapping[str, Any]] = (), interpreter: str | None = None,
             fs: HostFS | None = None, code_root: str | None = None) -> list[str]:
    """Every reason the runner refuses ``policy`` at run time; empty if it runs it.

    ``policy``: a :class:`~execution.sandbox.policy.model.Policy`, its YAML text or a mapping
    (an invalid one gives its :class:`~execution.sandbox.policy.model.PolicyError` problems);
    ``masked_paths``: host paths hidden from agents with no exception
    (:func:`runner_masked_paths`, plus the runner's private directories at run time);
    ``state_paths``: tco's state directory (``TCO_SANDBOX_MASK``), hidden too except
    ``shared_paths`` inside it (``TCO_SANDBOX_SHARED``); ``runtime``: ``bubblewrap`` also
    refuses what it cannot enforce (:meth:`Policy.refusals`), ``openshell`` only the
    paths; ``registered``: the model endpoints the site registered (the runner spec's
    ``model_endpoints``: mappings with ``host`` and ``port``): under OpenShell, which
    injects a provider's credential wherever the policy binds it, a ``credential_binding``
    on an endpoint that is not registered is refused (the bubblewrap runtime's proxy just
    adds none there); ``interpreter``: the host python that runs the relay inside the
    bubblewrap sandbox (the runner's ``sys.executable``, the launch side's
    ``TCO_RUNNER_PYTHON``): when given and no path is refused, the policy must show it
    at its own path, else "the relay runs <python> inside the sandbox: list its
    directory ..." (the argv builder's own check, :func:`execution.sandbox.bwrap.build_argv`,
    run on a stand-in plan); ``code_root``: tco's code directory,
    :data:`~execution.sandbox.paths.CODE_ROOT` when None (read-only paths inside it are not
    refused for lying in a scratch directory, see :func:`~execution.sandbox.paths.path_refusal`).
    Pure apart from reading the host's links and mounts through ``fs``."""
    from execution.sandbox.policy.load import load_policy
    from execution.sandbox.policy.model import Policy, PolicyError

    if not isinstance(policy, Policy):
        if not isinstance(policy, (str, Mapping)):
            return ["policy: expected YAML text or a mapping"]
        if isinstance(policy, str) and "\n" not in policy and policy.strip().startswith("/"):
            # load_policy would read that file (as the runner does for a spec naming one): never
            # for text a launcher typed.
            return ["policy: expected the policy's YAML text, not a file path"]
        try:
            policy = load_policy(policy)
        except PolicyError as exc:
            return list(exc.problems)
    fs = fs or HostFS()
    reasons = [str(f) for f in policy.refusals()] if runtime == "bubblewrap" else []
    if runtime == "openshell":
        known = {(str(r.get("host", "")).lower(), r.get("port")) for r in registered if isinstance(r, Mapping)}
        for _, endpoint in policy.endpoints():
            if endpoint.credential_provider and endpoint.host:
                for port in endpoint.ports:
                    if (endpoint.host.lower(), port) not in known:
                        reasons.append(f"{endpoint.where}.credential_binding: {endpoint.host}:{port} is not a "
                                       "registered model endpoint; OpenShell would give it the credential")
    masks, state = resolve_masks(masked_paths, fs), resolve_masks(state_paths, fs)
    shared = resolve_masks(shared_paths, fs)
    code = [CODE_ROOT if code_root is None else code_root]
    for field, paths in (("read_only", policy.read_only), ("read_write", policy.read_write)):
        for path in paths:
            reason = path_refusal(path, masks=masks, state=state, shared=shared, fs=fs,
                                  code=code if field == "read_only" else (), where=f"filesystem_policy.{field}")
            if reason is not None:
                reasons.append(reason)
    if interpreter and runtime == "bubblewrap" and not reasons:
        reasons += relay_refusals(policy, masked_paths=masked_paths, state_paths=state_paths,
                                  shared_paths=shared_paths, interpreter=interpreter, fs=fs, code=code[0])
    return reasons


def relay_refusals(policy: Any, *, masked_paths: Iterable[str], state_paths: Iterable[str],
                   shared_paths: Iterable[str], interpreter: str, fs: HostFS, code: str) -> list[str]:
    """What the bubblewrap argv builder refuses for ``policy`` once its paths pass (the relay's
    ``interpreter`` not shown inside), asked of the builder itself with a stand-in plan
    (no file descriptors or directories are used: it only computes the argv); ``code``: tco's
    code directory (:func:`refusals`' ``code_root``)."""
    plan = SandboxPlan(policy=policy, workdir="/nonexistent/work", socket_dir="/nonexistent/socket",
                       agent_argv=(), env={}, interpreter=interpreter,
                       fds=SandboxFds(status=3, json_status=4, stdout=5, stderr=6, data={INSIDE_RELAY: 7}),
                       hidden=HiddenPaths(masks=tuple(masked_paths), state=tuple(state_paths),
                                          shared=tuple(shared_paths)),
                       code_root=code)
    try:
        build_argv(plan, fs)
    except SandboxConfigError as exc:
        return [str(exc)]
    return []
