"""What the runner reads before the sandbox starts: the spec, the input, the policy, the paths.

See docs/runner.md ("The runner spec", "The sandbox"). Each function raises
RunnerError (execution/runner/config.py) for what the task's owner must fix.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

from execution.runner.config import INSIDE_WORKDIR, PASSED_THROUGH_ENV, PLACEHOLDER_KEY, RunnerError, \
    TaskIdentity, default_policy
from execution.spool.layout import SpoolLayout
from execution.spool.contract import SpecError
from execution.spool.spec import RunnerSpec


def read_spec(task: TaskIdentity) -> tuple[dict, float | None]:
    """The campaign's runner spec, checked by the spool contract (execution/spool/spec.py), as
    ``(its JSON mapping with inputs_file made absolute, its kill_grace_s in seconds or None)``.
    Raises RunnerError (unreadable, invalid, or for another campaign)."""
    path = task.layout.spec_path(task.campaign_id)
    try:
        spec = RunnerSpec.read(path)
    except OSError as exc:
        raise RunnerError(f"cannot read runner spec {path}: {exc.strerror}") from exc
    except SpecError as exc:
        raise RunnerError(f"runner spec {path}: {exc}") from exc
    # The launcher may write the id as a number; the environment always has text.
    if isinstance(spec.campaign_id, bool) or str(spec.campaign_id) != task.campaign_id:
        raise RunnerError(f"runner spec {path} is for campaign {spec.campaign_id!r}, "
                          f"not {task.campaign_id!r}")
    data = spec.to_json()
    # Relative to the campaign folder; absolute paths stay as they are.
    data["inputs_file"] = os.path.join(task.layout.campaign_dir(task.campaign_id), spec.inputs_file)
    return data, (float(spec.kill_grace_s) if spec.kill_grace_s is not None else None)


def read_input(inputs_file: str, task_number: int) -> str:
    """Line ``task_number`` (1-based) of the JSONL ``inputs_file``, without its newline.
    Raises RunnerError (unreadable, too short, or the line is not JSON)."""
    try:
        with open(inputs_file, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if number == task_number:
                    break
            else:
                raise RunnerError(f"{inputs_file} has no line {task_number}")
    except OSError as exc:
        raise RunnerError(f"cannot read inputs file {inputs_file}: {exc.strerror}") from exc
    line = line.rstrip("\n")
    try:
        json.loads(line)
    except ValueError as exc:
        raise RunnerError(f"{inputs_file} line {task_number} is not JSON: {exc}") from exc
    return line


def load_spec_policy(spec: Mapping):
    """The spec's sandbox policy (execution/sandbox/policy/model.py ``Policy``), or
    :func:`~execution.runner.config.default_policy` without one. Raises RunnerError."""
    from execution.sandbox.policy.load import load_policy
    from execution.sandbox.policy.model import PolicyError

    source = spec.get("policy")
    try:
        return load_policy(default_policy() if source in (None, "") else source)
    except PolicyError as exc:
        raise RunnerError(str(exc)) from exc


def choose_runtime(environ: Mapping[str, str], spec: Mapping, policy) -> str:
    """``bubblewrap`` or ``openshell``: ``TCO_SANDBOX_RUNTIME``, else the spec's, else (``auto``)
    OpenShell where ``openshell`` is on PATH and no policy endpoint is loopback. Raises
    RunnerError for another name."""
    wanted = environ.get("TCO_SANDBOX_RUNTIME") or (spec.get("sandbox") or {}).get("runtime") or "auto"
    if wanted not in ("auto", "bubblewrap", "openshell"):
        raise RunnerError(f"sandbox runtime {wanted!r}: use auto, bubblewrap or openshell")
    if wanted == "auto":
        loopback = any(e.loopback for _, e in policy.endpoints())
        from execution.sandbox.bwrap import which

        wanted = "openshell" if which("openshell", environ.get("PATH")) and not loopback else "bubblewrap"
    return wanted


def registered_hosts(spec: Mapping) -> list[dict]:
    """``{"host", "port"}`` of each registered model endpoint of the spec (``model_endpoints``
    and the older ``model_endpoint.base_url`` with a credential), as far as they are well formed
    (the proxy setup reports the malformed ones)."""
    from urllib.parse import urlsplit

    found = [e for e in spec.get("model_endpoints") or [] if isinstance(e, dict)]
    endpoint = spec.get("model_endpoint") or {}
    if isinstance(endpoint.get("base_url"), str) and endpoint.get("credential_name"):
        try:
            parts = urlsplit(endpoint["base_url"])
            found.append({"host": parts.hostname or "", "port": parts.port or (443 if parts.scheme == "https" else 80)})
        except ValueError:
            pass
    return found


def credentials_file(environ: Mapping[str, str], spool: str) -> str:
    """The credentials file the proxy reads (``TCO_CREDENTIALS_FILE``, else the spool's)."""
    return environ.get("TCO_CREDENTIALS_FILE") or SpoolLayout(spool).credentials_path


def private_base(environ: Mapping[str, str]) -> str:
    """Where the runner's private directory goes: ``TMPDIR`` if it is an absolute directory,
    else ``/tmp``."""
    base = environ.get("TMPDIR") or "/tmp"
    return base if os.path.isabs(base) and os.path.isdir(base) else "/tmp"


def make_private_dir(environ: Mapping[str, str]) -> str:
    """Make the runner's private directory (0700) under :func:`private_base`; its path.
    Raises RunnerError after 100 names taken."""
    base = private_base(environ)
    for attempt in range(100):
        path = os.path.join(base, f"tco-runner-{os.getpid()}-{attempt}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise RunnerError(f"cannot make a private directory in {base}")


def sandbox_paths(environ: Mapping[str, str], spool: str, private_dir: str | None = None) -> dict[str, list[str]]:
    """What no agent may see (:func:`execution.sandbox.checks.refusals`' arguments), as lists of
    absolute host paths: ``masked`` (the spool, credential and price files, the runners' private
    directories: ``private_dir``, this runner's TMPDIR and, for Grid Engine's per-job TMPDIR, the
    directory holding every job's), ``state`` (``TCO_SANDBOX_MASK``) and ``shared``
    (``TCO_SANDBOX_SHARED``)."""
    from execution.sandbox.checks import runner_masked_paths

    masked = runner_masked_paths(spool=spool, credentials_file=credentials_file(environ, spool),
                                 prices_file=environ.get("TCO_PRICES_FILE") or None)
    base = os.path.normpath(private_base(environ))
    if private_dir:
        masked.append(private_dir)
    if base != "/":
        masked.append(base)
        parent = os.path.dirname(base)
        job = environ.get("JOB_ID", "")
        if job and os.path.basename(base).startswith(f"{job}.") and parent != "/":
            masked.append(parent)  # /tmp/<job>.<task>.<queue>: the other jobs' are its siblings

    def listed(name: str) -> list[str]:
        return [p for p in environ.get(name, "").split(":") if p.startswith("/")]

    return {"masked": masked, "state": listed("TCO_SANDBOX_MASK"), "shared": listed("TCO_SANDBOX_SHARED")}


def agent_env(environ: Mapping[str, str], spec: Mapping, task: TaskIdentity, relay_port: int) -> dict[str, str]:
    """The agent's whole environment (docs/runner.md, "The sandbox"): never a credential; the
    model base URLs point at the relay on ``relay_port`` of the sandbox's loopback."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": INSIDE_WORKDIR, "USER": "sandbox",
           "LOGNAME": "sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    for key in PASSED_THROUGH_ENV:
        if key in environ:
            env[key] = environ[key]
    base = f"http://127.0.0.1:{relay_port}"
    env.update(ANTHROPIC_BASE_URL=base, OPENAI_BASE_URL=f"{base}/v1", ANTHROPIC_API_KEY=PLACEHOLDER_KEY,
               OPENAI_API_KEY=PLACEHOLDER_KEY)
    if isinstance(spec.get("model"), str) and spec["model"]:
        env["TCO_MODEL"] = spec["model"]
    env.update(spec["agent"].get("environment") or {})
    env.update(TCO_CAMPAIGN_ID=task.campaign_id, TCO_TASK_NUMBER=str(task.task_number),
               TCO_INPUT_FILE=f"{INSIDE_WORKDIR}/input.json", TCO_WORK_DIR=INSIDE_WORKDIR)
    return env


def write_input(work_dir: str, text: str) -> None:
    """Write the task's input to ``input.json`` in the work directory (0600), never through a
    link a previous attempt's agent may have left there. Raises OSError."""
    path = os.path.join(work_dir, "input.json")
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
