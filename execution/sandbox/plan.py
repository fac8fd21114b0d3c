"""What a bubblewrap sandbox is built from: :class:`SandboxPlan`, passed whole to
:func:`execution.sandbox.bwrap.build_argv`, and its parts. Standard library only.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from execution.sandbox.paths import CODE_ROOT
from execution.sandbox.policy.model import Policy

__all__ = ["RELAY_PORT", "RELAY_SCRIPT", "TMPFS_BYTES", "MAX_PROCESSES", "SandboxFds", "HiddenPaths", "SandboxLimits",
           "RelayOptions", "SandboxPlan"]

#: The relay's loopback port inside the sandbox (the agent's model base URL).
RELAY_PORT = 8790
RELAY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")
#: Defaults of the sandbox's limits (the runner's settings override them).
TMPFS_BYTES = 256 << 20          # each writable private tmpfs (/tmp, /var/tmp, /dev/shm, /run, ...)
MAX_PROCESSES = 256              # RLIMIT_NPROC inside the sandbox (its own user namespace)


@dataclass(frozen=True)
class SandboxFds:
    """The runner's file descriptors bubblewrap and the relay get (``pass_fds``; they keep their
    numbers): ``status`` (the relay's status lines), ``json_status`` (bwrap's
    ``--json-status-fd``), ``stdout``/``stderr`` (the agent's), ``data`` (inside path -> fd of
    its content, ``--ro-bind-data``; the relay's script at ``/run/tco-relay.py`` among them, copied
    in rather than bound, so the sandbox's mountinfo does not show where tco's code lies), ``watch`` (open on the runner's /proc/PID/stat, for
    suspension; or None), ``seccomp`` (the seccomp filter's program, ``--seccomp``; or None:
    no filter)."""

    status: int
    json_status: int
    stdout: int
    stderr: int
    data: Mapping[str, int] = field(default_factory=dict)
    watch: int | None = None
    seccomp: int | None = None
    files: Mapping[str, int] = field(default_factory=dict)
    hold: int | None = None

    def passed(self) -> list[int]:
        """Every descriptor to pass to bubblewrap."""
        fds = [self.status, self.json_status, self.stdout, self.stderr, *self.data.values(), *self.files.values()]
        return fds + [fd for fd in (self.watch, self.seccomp, self.hold) if fd is not None]


@dataclass(frozen=True)
class HiddenPaths:
    """Host paths the agent never sees: ``masks`` (a listed path inside one is refused; one
    above is covered inside); ``state``: tco's state directory (``TCO_SANDBOX_MASK``), hidden
    the same way except ``shared`` directories inside it, which may be listed
    (``TCO_SANDBOX_SHARED``). Absolute paths."""

    masks: tuple[str, ...] = ()
    state: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxLimits:
    """``tmpfs_bytes``: size of each writable private tmpfs (bytes); ``max_processes``:
    RLIMIT_NPROC of the sandbox's processes (threads count); ``memory_bytes``: RLIMIT_DATA of
    each process (its heap and private writable mappings; None: unlimited); ``file_bytes``:
    RLIMIT_FSIZE (the largest file a process may write; None: unlimited); ``cpu_s``:
    RLIMIT_CPU of each process (seconds; SIGXCPU at it, SIGKILL 5 s later; None: unlimited);
    ``work_bytes``: the size of the work directory, a tmpfs of its own at /sandbox whose size the
    kernel holds (a write past it fails with ENOSPC; its pages are charged to the task's memory
    cgroup), or None: /sandbox is the host work directory, bound (its size is the runner's walk).
    Each must be positive."""

    tmpfs_bytes: int = TMPFS_BYTES
    max_processes: int = MAX_PROCESSES
    memory_bytes: int | None = None
    file_bytes: int | None = None
    cpu_s: int | None = None
    work_bytes: int | None = None


@dataclass(frozen=True)
class RelayOptions:
    """How bubblewrap and the relay are run: the ``bwrap`` program, the sandbox's ``hostname``,
    the relay's loopback ``port`` inside, and how long it waits for the proxy (``proxy_wait_s``,
    seconds). The relay's script (:data:`RELAY_SCRIPT`) reaches the sandbox as data, through
    :attr:`SandboxFds.data` at ``/run/tco-relay.py``."""

    bwrap: str = "bwrap"
    hostname: str = "sandbox"
    port: int = RELAY_PORT
    proxy_wait_s: float = 30.0


@dataclass(frozen=True)
class SandboxPlan:
    """Everything :func:`~execution.sandbox.bwrap.build_argv` needs, passed whole.

    ``policy``: the validated policy; ``workdir``: host directory shown at /sandbox;
    ``socket_dir``: host directory shown read-only at /run/tco
    (with ``limits.work_bytes``, ``workdir`` is not shown: /sandbox is a tmpfs of that size); ``agent_argv``: the agent's
    command; ``env``: the agent's whole environment; ``interpreter``: the host python that runs
    the relay inside; ``fds``: :class:`SandboxFds`; ``hidden``: :class:`HiddenPaths`;
    ``limits``: :class:`SandboxLimits`; ``options``: :class:`RelayOptions`; ``code_root``: tco's
    code directory, whose paths may be listed read-only even inside a scratch directory (a clone
    in /tmp; :data:`~execution.sandbox.paths.CODE_ROOT` by default). ``notes`` is the one
    part filled in later: what :func:`~execution.sandbox.bwrap.build_argv` skipped or changed, for the record.
    """

    policy: Policy
    workdir: str
    socket_dir: str
    agent_argv: Sequence[str]
    env: Mapping[str, str]
    interpreter: str
    fds: SandboxFds
    hidden: HiddenPaths = HiddenPaths()
    limits: SandboxLimits = SandboxLimits()
    options: RelayOptions = RelayOptions()
    code_root: str = CODE_ROOT
    notes: list[str] = field(default_factory=list, init=False, compare=False)
