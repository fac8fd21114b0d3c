"""The bubblewrap runtime: the argv that enforces a policy, and one sandbox's run.

:func:`build_argv` turns a :class:`~execution.sandbox.plan.SandboxPlan` (a validated policy, the task's
work directory, the proxy socket's directory, the agent's argv and
environment) into a ``bwrap`` command line:

- its own user, PID, IPC, UTS, cgroup and network namespaces
  (``--unshare-all --unshare-user``), no nested user namespaces
  (``--disable-userns``), ``--die-with-parent``, a new session
  (``--new-session``: no terminal to inject input into), every capability
  dropped, uid/gid of ``process.run_as_user``/``run_as_group`` inside
  (``sandbox`` is 1000; never 0);
- only the listed paths: ``read_only`` with ``--ro-bind``, ``read_write``
  with ``--bind``, the work directory at ``/sandbox`` (read-write when
  ``include_workdir`` or ``/sandbox`` is in ``read_write``): with
  :attr:`~execution.sandbox.plan.SandboxLimits.work_bytes` a tmpfs of that size
  (``--size N --tmpfs /sandbox``, the input copied in with ``--file``), else the
  host work directory bound; a fresh ``/proc``
  and minimal ``/dev``; the root itself and ``/dev`` are read-only; a listed
  path missing on the host is skipped (reported in
  :attr:`~execution.sandbox.plan.SandboxPlan.notes`); Debian's merged-/usr links (``/bin`` ->
  ``usr/bin``, ...) are recreated as links;
- the host's scratch directories (``/tmp``, ``/var/tmp``, ``/dev/shm``,
  ``/run``, ``/run/lock``, ``/var/lock``: other tasks' files and sockets) are
  never shown: listed (or listed under another name that resolves to one, like
  ``/run/shm``), they are the sandbox's own fresh tmpfs of
  :attr:`~execution.sandbox.plan.SandboxLimits.tmpfs_bytes` (bwrap ``--size``); shown under a listed
  ancestor, an empty read-only tmpfs; a path inside one is refused;
- tco's own files are never visible: the spool, the credentials and price
  files, tco's state directory and the runners' private directories are
  compared after resolving links and bind mounts; a listed path inside one
  is refused (:func:`execution.sandbox.checks.path_refusal`, the same check the
  launch form makes), and under a listed ancestor they are covered (empty
  tmpfs, or ``/dev/null`` for a file) at every place they appear inside;
- the relay limits the sandbox's processes (RLIMIT_NPROC, counted in the
  sandbox's own user namespace, so other tasks of the same host account do not
  count) to :attr:`~execution.sandbox.plan.SandboxLimits.max_processes`, and each
  process's memory (RLIMIT_DATA), file size (RLIMIT_FSIZE) and CPU time (RLIMIT_CPU)
  to the other :class:`~execution.sandbox.plan.SandboxLimits`;
- no name resolver: ``/etc/resolv.conf`` is ``/dev/null``, and the network
  namespace has nothing but loopback; ``/etc/passwd`` and ``/etc/group`` are
  generated (user ``sandbox``);
- ``--clearenv`` and only the chosen variables (never a credential);
- with :attr:`~execution.sandbox.plan.SandboxFds.seccomp`, the default seccomp filter
  (execution/sandbox/seccomp.py: the dangerous system calls fail with EPERM);
- the command is the relay (execution/sandbox/relay.py, copied in from a
  descriptor with ``--ro-bind-data``: a bind would show the repository's path
  in the sandbox's ``/proc/self/mountinfo``) as PID 1, which starts the agent;
  the proxy socket's directory is bound read-only at ``/run/tco``.

:class:`BwrapSandbox` runs it: ``sandbox_create_at`` is taken just before
bubblewrap is started, ``sandbox_ready_at`` is the relay's "ready" (the
sandbox is built and the loopback listener is up, before the agent is
executed), then ``agent_started_at`` and ``agent_exited_at`` from the relay.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

from execution.sandbox import SandboxStartError
from execution.sandbox.paths import (INSIDE_RELAY, INSIDE_SOCKET_DIR, INSIDE_WORKDIR, PRIVATE_DIRS, HostFS,
                                     path_refusal, private_dir_target, resolve_masks, under)
from execution.sandbox.plan import SandboxPlan

__all__ = ["SandboxConfigError", "BwrapSandbox", "build_argv", "which", "passwd_text", "group_text"]

INSIDE_SOCKET = f"{INSIDE_SOCKET_DIR}/proxy.sock"
MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
LOG_CAP_BYTES = 64 * 1024
HIDING_TMPFS_BYTES = 64 << 10    # the read-only tmpfs that cover tco's files and the host's scratch dirs
SIGNALS_KEPT_FROM_BWRAP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                           signal.SIGXCPU, signal.SIGQUIT, signal.SIGALRM)


class SandboxConfigError(ValueError):
    """The policy cannot be applied here (a listed path inside tco's files, no interpreter
    for the relay, no bubblewrap); the message says what to change."""


def which(name: str, path: str | None = None) -> str | None:
    """``name`` found on ``path`` (default ``$PATH``, else the usual system directories)."""
    for directory in (path or os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def passwd_text(uid: int, gid: int) -> str:
    """The sandbox's generated /etc/passwd: root, ``sandbox`` (``uid``/``gid``, home /sandbox), nobody."""
    return (f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{gid}:tco sandbox:{INSIDE_WORKDIR}:/usr/sbin/nologin\n"
            f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")


def group_text(gid: int) -> str:
    """The sandbox's generated /etc/group: root, ``sandbox`` (``gid``), nogroup."""
    return f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n"


def build_argv(plan: SandboxPlan, fs: HostFS | None = None) -> list[str]:
    """The bwrap command line for ``plan`` (module doc). Appends to ``plan.notes`` what it
    skipped. Raises SandboxConfigError (with :func:`~execution.sandbox.checks.path_refusal`'s
    reason for a path the runner refuses)."""
    fs = fs or HostFS()
    policy = plan.policy
    if policy.uid == 0 or policy.gid == 0:  # validation already refuses it; never rely on one check
        raise SandboxConfigError("the agent may not run as root inside the sandbox")
    limits = plan.limits
    if limits.tmpfs_bytes < 1 or limits.max_processes < 1 or any(
            value is not None and value < 1
            for value in (limits.memory_bytes, limits.file_bytes, limits.cpu_s, limits.work_bytes)):
        raise SandboxConfigError("the sandbox's limits must be positive")
    masks = resolve_masks(plan.hidden.masks, fs)
    state = resolve_masks(plan.hidden.state, fs)
    shared = resolve_masks(plan.hidden.shared, fs)
    workdir_rw = policy.include_workdir or INSIDE_WORKDIR in policy.read_write

    # (inside path, order, argv) - applied shallow to deep so later mounts land on earlier ones.
    ops: list[tuple[str, int, list[str]]] = []
    order = 0
    binds: list[tuple[str, str]] = []   # (inside path, canonical host path) of each bind
    # tmpfs made read-only only after every mount, so mount points can still be made inside them
    read_only_later: list[str] = []
    private_listed: set[str] = set()

    def add(path: str, *args: str) -> None:
        nonlocal order
        order += 1
        ops.append((path, order, list(args)))

    listed = [(p, False) for p in policy.read_only] + [(p, True) for p in policy.read_write]
    for path, writable in listed:
        if path == INSIDE_WORKDIR:
            continue
        reason = path_refusal(path, masks=masks, state=state, shared=shared, fs=fs,
                              code=() if writable else (plan.code_root,))
        if reason is not None:
            raise SandboxConfigError(reason)
        if private_dir_target(path, fs) is not None:
            # Listed or resolving to /tmp, /dev/shm, /run, ...: the sandbox's own, never the host's.
            add(path, "--size", str(plan.limits.tmpfs_bytes), "--tmpfs", path)
            if not writable:
                read_only_later.append(path)
            private_listed.add(path)
            if path not in PRIVATE_DIRS:
                plan.notes.append(f"{path}: resolves to {fs.realpath(path)}; the sandbox has its own (empty)")
            continue
        if not fs.lexists(path):
            plan.notes.append(f"{path}: not on this host; skipped")
            continue
        real = fs.realpath(path)
        if fs.islink(path) and path in MERGED_USR_LINKS:
            continue  # recreated as a link below, if its target is visible
        if real != path and fs.islink(path):
            plan.notes.append(f"{path}: a link to {real}; its target is shown at {path}")
        add(path, "--bind" if writable else "--ro-bind", real, path)
        binds.append((path, real))

    # Whatever a bind shows of the host's scratch directories and of tco's own files is
    # covered, at every place it appears inside (a bind's inside path may differ from its
    # host path, when the listed path is a link).
    hidden = [(h, True) for h in resolve_masks(PRIVATE_DIRS, fs)] + [(h, False) for h in masks + state]
    # A hidden path inside another hidden directory is left to that directory's empty tmpfs:
    # a /dev/null bind inside it would make bubblewrap create the file's mount point there, showing
    # the hidden file's name (/etc/tco/database-url).
    covered: set[str] = set()
    for inside, real in binds:
        found: list[tuple[str, str]] = []  # (inside path, host path)
        for host, scratch in hidden:
            if host == real or not under(host, real) or fs.islink(host) or not fs.lexists(host):
                continue
            found.append((os.path.normpath(inside.rstrip("/") + "/" + host[len(real.rstrip("/")):].lstrip("/")),
                          host))
        emptied = [where for where, host in found if fs.isdir(host)]
        for where, host in found:
            if where in private_listed or where in covered:
                continue
            if any(under(where, above) and where != above for above in emptied):
                continue
            covered.add(where)
            if fs.isdir(host):
                add(where, "--size", str(HIDING_TMPFS_BYTES), "--tmpfs", where)
                read_only_later.append(where)
            else:
                add(where, "--ro-bind", "/dev/null", where)

    def is_visible(host_path: str) -> bool:
        """Shown inside at its own host path (the relay's interpreter, /etc): the deepest bind
        holding it shows the same host path, and nothing covers it above that."""
        holding = [(inside, real) for inside, real in binds if under(host_path, inside)]
        if not holding:
            return False
        inside, real = max(holding, key=lambda b: _depth(b[0]))
        return inside == real and not any(under(host_path, c) and _depth(c) > _depth(inside)
                                          for c in covered | private_listed)

    # Debian's merged /usr: /bin, /lib, ... are links into /usr; keep them links.
    for link in MERGED_USR_LINKS:
        shown_already = any(under(link, inside) and inside != link for inside, _ in binds)  # "/" listed
        if fs.islink(link) and not shown_already and is_visible(fs.realpath(link)):
            add(link, "--symlink", fs.readlink(link), link)

    if limits.work_bytes is not None:
        # The work directory's size held by the kernel (issue 23, finding 1): a tmpfs of its own,
        # a write past it fails with ENOSPC. The runner reaches it through the relay's root
        # (BwrapSandbox.work_fd) and copies what the agent leaves to the host work directory.
        add(INSIDE_WORKDIR, "--size", str(limits.work_bytes), "--tmpfs", INSIDE_WORKDIR)
        if not workdir_rw:
            read_only_later.append(INSIDE_WORKDIR)
        for inside, fd in sorted(plan.fds.files.items()):
            add(inside, "--perms", "0600", "--file", str(fd), inside)
    else:
        add(INSIDE_WORKDIR, "--bind" if workdir_rw else "--ro-bind", plan.workdir, INSIDE_WORKDIR)
    add(INSIDE_SOCKET_DIR, "--ro-bind", plan.socket_dir, INSIDE_SOCKET_DIR)
    if is_visible("/etc") and fs.lexists("/etc/resolv.conf") and not fs.islink("/etc/resolv.conf"):
        add("/etc/resolv.conf", "--ro-bind", "/dev/null", "/etc/resolv.conf")
    elif is_visible("/etc") and fs.islink("/etc/resolv.conf"):
        plan.notes.append("/etc/resolv.conf: a link outside the sandbox; no resolver is reachable anyway")
    for inside, fd in sorted(plan.fds.data.items()):
        add(inside, "--ro-bind-data", str(fd), inside)

    if INSIDE_RELAY not in plan.fds.data:
        raise SandboxConfigError(f"no descriptor of the relay's script for {INSIDE_RELAY} (SandboxFds.data)")
    interpreter = fs.realpath(plan.interpreter)
    if not is_visible(interpreter):
        raise SandboxConfigError(f"the relay runs {interpreter} inside the sandbox: list its directory "
                                 "(for example /usr) in filesystem_policy.read_only")

    ops.sort(key=lambda op: (_depth(op[0]), op[1]))
    argv = [plan.options.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--cap-drop", "ALL",
            "--uid", str(policy.uid), "--gid", str(policy.gid), "--hostname", plan.options.hostname,
            "--json-status-fd", str(plan.fds.json_status)]
    if plan.fds.seccomp is not None:
        argv += ["--seccomp", str(plan.fds.seccomp)]
    # /proc and /dev come first among the depth-1 mounts' peers; "/" (if listed) before them.
    root_ops = [op for op in ops if op[0] == "/"]
    for _, _, args in root_ops:
        argv += args
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for _, _, args in (op for op in ops if op[0] != "/"):
        argv += args
    for path in sorted(read_only_later, key=_depth, reverse=True):
        argv += ["--remount-ro", path]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--chdir", INSIDE_WORKDIR, "--clearenv"]
    for key, value in sorted(plan.env.items()):
        argv += ["--setenv", key, value]
    argv += [interpreter, "-I", "-S", INSIDE_RELAY, "--status-fd", str(plan.fds.status),
             "--stdout-fd", str(plan.fds.stdout), "--stderr-fd", str(plan.fds.stderr),
             "--port", str(plan.options.port), "--socket", INSIDE_SOCKET,
             "--proxy-wait-s", str(plan.options.proxy_wait_s), "--max-processes", str(plan.limits.max_processes)]
    for option, value in (("--memory-bytes", limits.memory_bytes), ("--file-bytes", limits.file_bytes),
                          ("--cpu-s", limits.cpu_s)):
        if value is not None:
            argv += [option, str(value)]
    if plan.fds.watch is not None:
        argv += ["--watch-fd", str(plan.fds.watch)]
    if plan.fds.hold is not None:
        argv += ["--hold-fd", str(plan.fds.hold)]
    argv += ["--", *plan.agent_argv]
    return argv


# --------------------------------------------------------------------------- one run


class BwrapSandbox:
    """One agent in one bubblewrap sandbox (see :func:`build_argv` and the relay).

    ``on_proxy_wanted`` is called (in the caller's thread, from :meth:`wait_ready`
    or :meth:`wait_exit`) when the agent first connects to its base URL. Times
    in :attr:`mono` are CLOCK_MONOTONIC nanoseconds: ``create``, ``ready``,
    ``started``, ``exited``. :attr:`exit` is ``("code", N)`` or
    ``("signal", N)`` once known.
    """

    def __init__(self, plan: SandboxPlan, *, on_proxy_wanted: Callable[[], None] | None = None,
                 fs: HostFS | None = None) -> None:
        self.plan = plan
        self.argv = build_argv(plan, fs)
        #: Put before bubblewrap's argv when starting it (the runner's memory cgroup entry,
        #: execution/runner/memory_cgroup.py); empty: bubblewrap is started directly.
        self.launch_prefix: list[str] = []
        self.on_proxy_wanted = on_proxy_wanted
        self.proc: subprocess.Popen | None = None
        self.mono: dict[str, int] = {}
        self.exit: tuple[str, int] | None = None
        self.relay_pid: int | None = None
        self.spawn_error: str | None = None
        self.killed = False
        #: With a tmpfs work directory (``plan.limits.work_bytes``): the write end of the relay's
        #: hold pipe (``plan.fds.hold``'s other end, set by the caller), written once :attr:`work_fd`
        #: is open; :attr:`work_fd`: a descriptor of that tmpfs's root, opened through the relay's
        #: ``/proc/PID/root`` once it is "ready". It outlives the sandbox (a file system stays while
        #: a descriptor holds it), so the runner reads the agent's files after its end; the caller
        #: closes it (:meth:`close_workdir`).
        self.hold_w: int | None = None
        self.work_fd: int | None = None
        self._buffers = {"status": b"", "json": b""}
        self._log = bytearray()
        self._log_truncated = False
        self._selector: selectors.BaseSelector | None = None
        self._fds: dict[str, int] = {}

    # ---- start
    def start(self, status_r: int, json_r: int) -> None:
        """Start bubblewrap. ``status_r``/``json_r`` are the read ends of the relay's status
        pipe and of bwrap's ``--json-status-fd``; the caller closes the write ends after this."""
        bwrap = which(self.plan.options.bwrap) if not os.path.isabs(self.plan.options.bwrap) \
            else self.plan.options.bwrap
        if not bwrap:
            raise SandboxStartError("bubblewrap (bwrap) is not installed on this exec host")
        self.argv[0] = bwrap
        pass_fds = self.plan.fds.passed()
        # Grid Engine signals the whole process group (notify, suspend warnings, soft limits):
        # bubblewrap's monitor must outlive them, or its death would SIGKILL the sandbox
        # (--die-with-parent) before the runner stops the agent gracefully. Blocked signals
        # stay blocked across exec; bubblewrap unblocks them inside the sandbox.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS_KEPT_FROM_BWRAP)
        try:
            self.mono["create"] = time.monotonic_ns()
            self.proc = subprocess.Popen([*self.launch_prefix, *self.argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, pass_fds=pass_fds, env={}, close_fds=True)
        except OSError as exc:
            raise SandboxStartError(f"cannot start bubblewrap: {exc.strerror or exc}") from exc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self._selector = selectors.DefaultSelector()
        for name, fd in (("status", status_r), ("json", json_r), ("log", self.proc.stderr.fileno())):
            os.set_blocking(fd, False)
            self._fds[name] = fd
            self._selector.register(fd, selectors.EVENT_READ, name)

    # ---- events
    def _pump(self, timeout: float | None) -> bool:
        """Read what is there (waiting up to ``timeout``); False once every pipe is closed."""
        assert self._selector is not None
        if not self._selector.get_map():
            return False
        for key, _ in self._selector.select(timeout):
            name = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                self._selector.unregister(key.fd)
                if name != "log":
                    os.close(key.fd)
                continue
            if name == "log":
                room = LOG_CAP_BYTES - len(self._log)
                self._log += data[:max(room, 0)]
                self._log_truncated |= len(data) > room
                continue
            buffer = self._buffers[name] + data
            *lines, self._buffers[name] = buffer.split(b"\n")
            for line in lines:
                self._event(name, line.decode("utf-8", "replace"))
        return True

    def _event(self, source: str, line: str) -> None:
        if source == "json":
            import json

            try:
                data = json.loads(line)
            except ValueError:
                return
            if isinstance(data, dict) and isinstance(data.get("child-pid"), int):
                self.relay_pid = data["child-pid"]
            return
        word, _, rest = line.partition(" ")
        if word in ("ready", "started", "proxy") and rest.isdigit():
            self.mono.setdefault(word, int(rest))
            if word == "proxy" and self.on_proxy_wanted is not None:
                self.on_proxy_wanted()
        elif word == "exited" and self.exit is None:  # the relay says it once; a second line is not believed
            parts = rest.split()
            if len(parts) == 3 and parts[0] in ("code", "signal") and parts[2].isdigit():
                self.exit = (parts[0], int(parts[1]))
                self.mono["exited"] = int(parts[2])
        elif word == "spawn-error":
            self.spawn_error = rest.partition(" ")[2] or rest

    def wait_ready(self) -> None:
        """Block until the agent runs (``started``); raise SandboxStartError if it never will."""
        while "started" not in self.mono:
            if self.spawn_error is not None:
                raise SandboxStartError(f"cannot start agent {self.plan.agent_argv[0]!r}: {self.spawn_error}")
            if self.hold_w is not None and "ready" in self.mono and self.relay_pid is not None:
                self._open_workdir()
                continue
            if not self._pump(None):
                self.proc.wait()
                raise SandboxStartError(self._failure_text())

    def _open_workdir(self) -> None:
        """Open the sandbox's tmpfs work directory (:attr:`work_fd`) while the relay waits on its hold
        pipe, and let the relay go on; on failure say why (:attr:`spawn_error`) and close the pipe
        unwritten: the relay then ends without starting the agent. The relay runs as this account in
        a user namespace this process's account owns, so ``/proc/PID/root`` is open to it although
        the relay is not dumpable. Only after "ready" (the relay is PID 1 of the built sandbox,
        whose /sandbox is the tmpfs); the descriptor is checked to be a file system of the limit's
        size (statvfs: pages of ``f_frsize`` bytes)."""
        hold, self.hold_w = self.hold_w, None
        want = self.plan.limits.work_bytes
        try:
            fd = os.open(f"/proc/{self.relay_pid}/root{INSIDE_WORKDIR}",
                         os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            self.spawn_error = f"its work directory could not be opened: {exc.strerror or exc}"
            os.close(hold)
            return
        info = os.fstatvfs(fd)
        if info.f_blocks * info.f_frsize != -(-want // info.f_frsize) * info.f_frsize:
            os.close(fd)
            os.close(hold)
            self.spawn_error = (f"its work directory is not the sandbox's tmpfs of {want} bytes "
                                f"({info.f_blocks} blocks of {info.f_frsize} bytes)")
            return
        self.work_fd = fd
        try:
            os.write(hold, b"g")
        finally:
            os.close(hold)

    def close_workdir(self) -> None:
        """Close :attr:`work_fd` (the tmpfs goes with it once the sandbox has ended) and the hold
        pipe if still open. Idempotent."""
        for name in ("work_fd", "hold_w"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                os.close(fd)

    def wait_exit(self) -> None:
        """Block until the agent has exited and bubblewrap is gone."""
        while self._pump(None):
            pass
        self.proc.wait()

    def _failure_text(self) -> str:
        log = self.log().strip()
        code = self.proc.returncode if self.proc is not None else None
        return f"the sandbox did not start (bubblewrap exit {code})" + (f": {log[-2000:]}" if log else "")

    def log(self) -> str:
        """What bubblewrap and the relay wrote to their stderr (capped)."""
        return self._log.decode("utf-8", "replace") + ("\n[truncated]" if self._log_truncated else "")

    # ---- stop
    def stop(self, grace_s: float) -> None:
        """Ask the agent to stop (SIGTERM to every process of the sandbox, through the relay),
        wait ``grace_s``, then kill the sandbox (SIGKILL to the relay ends its PID namespace)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if self.relay_pid is not None and "ready" in self.mono:
                self._signal_relay(signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                while self.proc.poll() is None and time.monotonic() < deadline:
                    self._pump(min(0.05, max(deadline - time.monotonic(), 0)))
            if self.proc.poll() is None:
                self.killed = True
                if self.relay_pid is not None:
                    self._signal_relay(signal.SIGKILL)
                else:
                    self.proc.kill()  # the child dies with it (--die-with-parent)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and self._pump(0.05):
            pass
        self.close()

    def _signal_relay(self, signum: int) -> None:
        try:
            os.kill(self.relay_pid, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Close the pipes this object reads (status, bwrap's JSON status, its stderr). Idempotent."""
        if self._selector is not None:
            for key in list(self._selector.get_map().values()):
                self._selector.unregister(key.fd)
                if key.data != "log":
                    os.close(key.fd)
            self._selector.close()
            self._selector = None
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
