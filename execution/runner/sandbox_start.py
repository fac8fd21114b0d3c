"""Preparing the agent's sandbox: bubblewrap (with the relay and the metering proxy) or OpenShell.

See docs/runner.md ("The sandbox"). The runner (execution/runner/main.py)
takes the sandbox object before starting it, so that a stop always finds it.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping

from execution.runner.config import INSIDE_WORKDIR, RunnerError, TaskIdentity
from execution.runner.task import agent_env


@dataclasses.dataclass(frozen=True)
class AgentStart:
    """What either runtime needs to start the agent: the validated ``policy``, the agent's
    ``argv`` (as it sees its paths), the host ``work_dir`` (shown at /sandbox), the runner's
    ``private_dir``, and the write ends of the agent's stdout/stderr pipes (``out_w``,
    ``err_w``; the runner closes them)."""

    policy: object
    argv: list[str]
    work_dir: str
    private_dir: str
    out_w: int
    err_w: int


class BwrapLaunch:
    """One bubblewrap start: its pipes and descriptors, the plan, and the sandbox object.

    Made by :func:`prepare_bwrap`; take :attr:`sandbox` and :attr:`notes`, then call
    :meth:`start` once. The descriptors opened here are closed by the end of :meth:`start` (or
    at once when preparing fails); the read ends of the status pipes pass to the sandbox.
    """

    def __init__(self, private_dir: str, policy, *, input_path: str | None = None,
                 seccomp: bytes | None = None) -> None:
        from execution.sandbox.bwrap import group_text, passwd_text
        from execution.sandbox.paths import INSIDE_RELAY
        from execution.sandbox.plan import RELAY_SCRIPT

        self.socket_dir = os.path.join(private_dir, "sock")
        os.mkdir(self.socket_dir, 0o700)
        self.status_r, self.status_w = os.pipe()
        self.json_r, self.json_w = os.pipe()
        self.data_fds: dict[str, int] = {}
        for inside, text in (("/etc/passwd", passwd_text(policy.uid, policy.gid)),
                             ("/etc/group", group_text(policy.gid))):
            r, w = os.pipe()
            os.write(w, text.encode())
            os.close(w)
            self.data_fds[inside] = r
        # The relay's script is copied in (--ro-bind-data), not bound: the sandbox's mountinfo would
        # show a bind's host path, the repository's (issue 23, finding 10).
        self.data_fds[INSIDE_RELAY] = os.open(RELAY_SCRIPT, os.O_RDONLY | os.O_CLOEXEC)
        self.watch_fd = os.open(f"/proc/{os.getpid()}/stat", os.O_RDONLY)
        # A tmpfs work directory (input_path given): the input copied in from the host's file, and
        # the pipe the relay waits on until the runner holds that tmpfs (BwrapSandbox.work_fd).
        self.file_fds: dict[str, int] = {}
        self.hold_r = self.hold_w = None
        if input_path is not None:
            self.file_fds[f"{INSIDE_WORKDIR}/input.json"] = os.open(input_path, os.O_RDONLY | os.O_NOFOLLOW)
            self.hold_r, self.hold_w = os.pipe()
        self.seccomp_fd: int | None = None
        self.notes: list[str] = []
        if seccomp is not None:
            r, w = os.pipe()  # a few KiB: the pipe (64 KiB) holds them all
            os.write(w, seccomp)
            os.close(w)
            self.seccomp_fd = r
        self.sandbox = None

    def _ours(self) -> list[int]:
        return [self.status_w, self.json_w, self.watch_fd, *self.data_fds.values(), *self.file_fds.values(),
                *(fd for fd in (self.seccomp_fd, self.hold_r) if fd is not None)]

    def _close(self, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)

    def fail(self) -> None:
        """Close every descriptor: the sandbox was never made."""
        self._close([self.status_r, self.json_r, *self._ours(), *([self.hold_w] if self.hold_w is not None else [])])

    def start(self) -> None:
        """Start bubblewrap. Raises RunnerError when it cannot start."""
        from execution.sandbox import SandboxStartError

        self.sandbox.hold_w, self.hold_w = self.hold_w, None  # the sandbox's now (closed by it)
        try:
            self.sandbox.start(self.status_r, self.json_r)
        except SandboxStartError as exc:
            raise RunnerError(str(exc)) from exc
        except BaseException:
            if self.sandbox.proc is None:
                self._close([self.status_r, self.json_r])
            raise
        finally:
            self._close(self._ours())


def prepare_bwrap(start: AgentStart, *, env: Mapping[str, str], paths: Mapping[str, list[str]],
                  limits: Mapping[str, int], on_proxy_wanted: Callable[[], None],
                  work_tmpfs: bool = False, seccomp: bytes | None = None) -> BwrapLaunch:
    """The bubblewrap sandbox of ``start`` with the agent's ``env``, not started yet: the proxy
    socket's directory made in the private directory, ``paths``
    (:func:`~execution.runner.task.sandbox_paths`) hidden, ``limits`` (environment variable
    -> value, :func:`~execution.runner.config.effective_limits`); ``on_proxy_wanted`` is called when the agent first wants its model base URL.
    ``work_tmpfs``: /sandbox is a tmpfs of ``TCO_SANDBOX_WORK_BYTES`` (the kernel holds the disk
    limit) holding a copy of the host work directory's ``input.json``; else the host work directory.
    ``seccomp``: the seccomp filter's BPF program (execution/sandbox/seccomp.py ``program_bytes``),
    passed to bubblewrap through a pipe (``--seccomp FD``); None: no filter.
    Raises RunnerError when the policy cannot be applied here (every descriptor it opened is
    closed then)."""
    from execution.sandbox.bwrap import BwrapSandbox, SandboxConfigError
    from execution.sandbox.plan import HiddenPaths, SandboxFds, SandboxLimits, SandboxPlan

    launch = BwrapLaunch(start.private_dir, start.policy,
                         input_path=os.path.join(start.work_dir, "input.json") if work_tmpfs else None,
                         seccomp=seccomp)
    try:
        plan = SandboxPlan(
            policy=start.policy, workdir=start.work_dir, socket_dir=launch.socket_dir, agent_argv=start.argv,
            env=env, interpreter=sys.executable,
            fds=SandboxFds(status=launch.status_w, json_status=launch.json_w, stdout=start.out_w,
                           stderr=start.err_w, data=launch.data_fds, watch=launch.watch_fd,
                           seccomp=launch.seccomp_fd, files=launch.file_fds, hold=launch.hold_r),
            hidden=HiddenPaths(masks=tuple(paths["masked"]), state=tuple(paths["state"]),
                               shared=tuple(paths["shared"])),
            limits=SandboxLimits(tmpfs_bytes=limits["TCO_SANDBOX_TMPFS_BYTES"],
                                 max_processes=limits["TCO_SANDBOX_MAX_PROCESSES"],
                                 memory_bytes=limits["TCO_SANDBOX_MEMORY_BYTES"],
                                 file_bytes=limits["TCO_SANDBOX_FILE_BYTES"], cpu_s=limits["TCO_SANDBOX_CPU_S"],
                                 work_bytes=limits["TCO_SANDBOX_WORK_BYTES"] if work_tmpfs else None))
        try:
            launch.sandbox = BwrapSandbox(plan, on_proxy_wanted=on_proxy_wanted)
        except SandboxConfigError as exc:
            raise RunnerError(str(exc)) from exc
    except BaseException:
        launch.fail()
        raise
    launch.notes = launch.notes + plan.notes
    return launch


def openshell_sandbox(start: AgentStart, *, spec: Mapping, environ: Mapping[str, str], task: TaskIdentity):
    """The OpenShell sandbox (execution/sandbox/openshell.py ``OpenShellSandbox``) of ``start``,
    not started yet. Under OpenShell the agent talks to its model
    endpoint itself, through OpenShell's proxy: no relay, no placeholder keys, and the
    ``model_endpoint.base_url`` (if any) as ``ANTHROPIC_BASE_URL``."""
    from execution.sandbox.openshell import OpenShellSandbox

    name = f"tco-{task.campaign_id}-{task.task_number}-{task.job_number or os.getpid()}".replace("_", "-")
    endpoint = spec.get("model_endpoint") or {}
    env = agent_env(environ, spec, task, 0)
    for key in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        env.pop(key, None)
    if endpoint.get("base_url"):
        env["ANTHROPIC_BASE_URL"] = endpoint["base_url"]
    return OpenShellSandbox(policy=start.policy, name=name, workdir=start.work_dir, agent_argv=start.argv, env=env,
                            stdout_fd=start.out_w, stderr_fd=start.err_w, private_dir=start.private_dir)


def agent_status(sandbox) -> tuple[int | None, int | None] | None:
    """``(signal, exit status)`` of the agent in ``sandbox`` (one of them None), or None while
    unknown: the relay's word, else SIGKILL when the sandbox was killed, else bubblewrap's
    own exit status."""
    if sandbox is None or sandbox.proc is None:
        return None
    if sandbox.exit is not None:
        kind, value = sandbox.exit
    elif sandbox.killed:
        kind, value = "signal", signal.SIGKILL
    elif sandbox.proc.returncode is not None:
        kind, value = "code", sandbox.proc.returncode
    else:
        return None
    return (value, None) if kind == "signal" else (None, value)
