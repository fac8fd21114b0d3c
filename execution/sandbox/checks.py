"""Which policies the runner refuses, as one pure function both the runner and the launch form call.

:func:`refusals` returns every reason the runner would refuse a policy at run
time, so that the launch side refuses the same policies before anything is
submitted (issue 11, finding 8). The runner calls it before it builds the
sandbox, and the bubblewrap argv builder (:mod:`execution.sandbox.bwrap`)
asks :func:`path_refusal` again for each listed path, so no path the function
lets through is bound differently.

What a listed path (``filesystem_policy.read_only``/``read_write``) may not be,
compared as written AND after resolving links (``realpath``) and bind mounts
(the other places a masked directory is mounted, from
``/proc/self/mountinfo``, see proc(5)):

- inside ``/proc`` or ``/dev`` (bubblewrap gives the sandbox its own; e.g.
  ``/proc/1/root`` is the host's root seen through PID 1), except
  ``/dev/shm`` itself;
- strictly inside one of :data:`PRIVATE_DIRS` (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run``, ``/run/lock``, ``/var/lock``): the host's hold other
  tasks' scratch space and sockets; those directories themselves are always
  the sandbox's own fresh tmpfs, whatever the policy lists (also when a
  listed path resolves to one, like ``/run/shm`` -> ``/dev/shm``). One
  exception, read-only only: a path inside tco's own code directory
  (:data:`CODE_ROOT`, the repository the runner and the launch side run
  from), as written and resolved, e.g. ``/tmp/x/demo`` and ``/tmp/x/.venv``
  of a clone in ``/tmp/x``: the bundled agents run from there, the setup makes
  it readable to the submit account, and it holds no other task's files (the
  state directory inside it stays masked below; a masked directory *above*
  it, like the ``/tmp`` that holds Grid Engine's per-job TMPDIRs, does not
  hide it);
- where tco puts its relay (``/run/tco``, ``/run/tco-relay.py``);
- one of the masked paths or inside one: the spool (every task's work
  directory, records and specs), the credentials and price files, tco's state
  directory (``TCO_SANDBOX_MASK``), the runner's private directories; a
  directory *above* a masked path is allowed, and the argv builder covers the
  masked path inside it (at every place it appears in the sandbox).

``shared`` paths (an admin's ``TCO_SANDBOX_SHARED``) are directories inside a
masked one that may be listed, e.g. a demo's output directory under the state
directory; the spool, the credential files and the runner's private
directories are never shared.

Standard library only (the runner imports it on every task).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

INSIDE_WORKDIR = "/sandbox"
INSIDE_SOCKET_DIR = "/run/tco"
INSIDE_RELAY = "/run/tco-relay.py"
#: Always the sandbox's own fresh tmpfs; nothing inside the host's may be listed.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/run/lock", "/var/lock")
KERNEL_DIRS = ("/proc", "/dev")
#: tco's own code directory (the repository; this file is execution/sandbox/checks.py in it),
#: resolved. Its paths may be listed read-only even where it lies inside a scratch directory of
#: :data:`PRIVATE_DIRS` (a clone in /tmp): the demo agents' code and venv are there.
CODE_ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

__all__ = ["CODE_ROOT", "HostFS", "PRIVATE_DIRS", "refusals", "path_refusal", "resolve_masks", "runner_masked_paths",
           "private_dir_target"]


def _under(path: str, ancestor: str) -> bool:
    """True if ``path`` is ``ancestor`` or inside it (both normalised, absolute)."""
    if ancestor == "/":
        return True
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def _unescape_mountinfo(field: str) -> str:
    # proc(5): space, tab, newline and backslash are written as \040, \011, \012, \134.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class HostFS:
    """What the checks and the argv builder ask of the host file system (a fake in unit tests)."""

    def lexists(self, path: str) -> bool:
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def islink(self, path: str) -> bool:
        return os.path.islink(path)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def mounts(self) -> list[tuple[str, str, str]]:
        """``(device, root, mount point)`` of each mount, in /proc/self/mountinfo's order
        (proc(5): fields 3, 4 and 5)."""
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            fields = line.split(" ")
            if len(fields) >= 5:
                found.append((fields[2], _unescape_mountinfo(fields[3]), _unescape_mountinfo(fields[4])))
        return found

    def mount_aliases(self, path: str) -> list[str]:
        """Other host paths where the directory or file ``path`` (canonical) is mounted too
        (bind mounts of it or of a directory above it)."""
        mounts = self.mounts()
        best = None
        for device, root, point in mounts:
            if _under(path, point) and (best is None or len(point) >= len(best[2])):
                best = (device, root, point)
        if best is None:
            return []
        device, root, point = best
        inner = os.path.normpath(root.rstrip("/") + "/" + path[len(point):].lstrip("/"))
        aliases = []
        for other_device, other_root, other_point in mounts:
            if other_device != device or not _under(inner, other_root):
                continue
            alias = os.path.normpath(other_point.rstrip("/") + "/" + inner[len(other_root.rstrip("/")):].lstrip("/"))
            if alias != path and alias not in aliases:
                aliases.append(alias)
        return aliases


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


def resolve_masks(paths: Iterable[str], fs: HostFS | None = None) -> list[str]:
    """``paths`` canonical: as written, resolved (realpath), and every other place the same
    directory or file is mounted. Paths missing on the host stay as written."""
    fs = fs or HostFS()
    out: list[str] = []
    for path in paths:
        if not path or not os.path.isabs(path):
            continue
        path = os.path.normpath(path)
        found = [path]
        if fs.lexists(path):
            try:
                real = fs.realpath(path)
            except OSError:
                real = None
            if real is not None:
                found += [real, *fs.mount_aliases(real)]
        for each in found:
            if each not in out:
                out.append(each)
    return out


def private_dir_target(path: str, fs: HostFS | None = None) -> str | None:
    """The private directory (:data:`PRIVATE_DIRS`) ``path`` is, as written or resolved, or None."""
    fs = fs or HostFS()
    if path in PRIVATE_DIRS:
        return path
    if fs.lexists(path):
        try:
            real = fs.realpath(path)
        except OSError:
            return None
        if real in PRIVATE_DIRS:
            return real
    return None


def path_refusal(path: str, *, masks: Iterable[str], state: Iterable[str] = (), shared: Iterable[str] = (),
                 code: Iterable[str] = (), fs: HostFS | None = None, where: str = "filesystem_policy") -> str | None:
    """Why the runner refuses to show the listed ``path`` (normalised, absolute) in the
    sandbox, or None. ``masks``, ``state``, ``shared``: canonical paths
    (:func:`resolve_masks`); a path inside ``state`` may be listed only inside one of
    ``shared`` (itself inside ``state`` and in no mask); one inside ``masks`` never.
    ``code``: tco's code directory (:data:`CODE_ROOT`) when ``path`` is listed read-only, else
    empty: a path inside it, as written and resolved, is not refused for lying in a scratch
    directory (a clone in /tmp); every other check still applies."""
    fs = fs or HostFS()
    code = [c for c in code if c and c != "/" and c not in PRIVATE_DIRS]
    if path == INSIDE_WORKDIR:
        return None
    if path == "/":
        return (f"{where}: / cannot be listed whole: the sandbox's own mount points (/sandbox, /run/tco) "
                "cannot be made in the host's root; list the directories the agent needs")
    try:
        real = fs.realpath(path) if fs.lexists(path) else path
    except OSError as exc:  # e.g. a link through /proc/1/root, which the runner may not read
        return f"{where}: {path} cannot be resolved ({exc.strerror or exc}); it cannot be listed"
    for shown in dict.fromkeys((path, real)):
        resolved = "" if shown == path else f" (it resolves to {shown})"
        if any(_under(shown, k) for k in KERNEL_DIRS) and shown != "/dev/shm":
            return (f"{where}: {path}{resolved}: bubblewrap gives the sandbox its own /proc and /dev; "
                    "nothing in them can be listed")
        if _under(shown, INSIDE_SOCKET_DIR) or shown == INSIDE_RELAY:
            return f"{where}: {path}{resolved} is where tco puts its relay; it cannot be listed"
    if real in PRIVATE_DIRS or path in PRIVATE_DIRS:
        return None  # the sandbox's own fresh tmpfs, never the host's
    in_code = any(_under(path, c) for c in code) and any(_under(real, c) for c in code)
    for shown in dict.fromkeys((path, real)):
        resolved = "" if shown == path else f" (it resolves to {shown})"
        inside = [d for d in PRIVATE_DIRS if _under(shown, d) and shown != d]
        if inside and not in_code:
            return (f"{where}: {path}{resolved} is inside {inside[0]}, which holds other tasks' scratch space; "
                    f"the sandbox always has its own {inside[0]} (list {inside[0]} itself for a private one)")
    masks, state = list(masks), list(state)
    if in_code:
        # A scratch directory masked for its other contents (Grid Engine's per-job TMPDIRs are
        # /tmp/<job>.<task>.<queue>, so the runner masks /tmp) does not hide tco's code inside it.
        masks = [m for m in masks if not any(_under(c, m) and c != m for c in code)]
    shared = [s for s in shared if any(_under(s, m) and s != m for m in state)
              and not any(_under(s, m) for m in masks)]
    resolved = f" (it resolves to {real})" if real != path else ""
    for mask in masks + state:
        if not (_under(real, mask) or _under(path, mask)):
            continue
        if mask in state and not any(_under(path, m) or _under(real, m) for m in masks) \
                and any(_under(real, s) and _under(path, s) and _under(s, mask) and s != mask for s in shared):
            continue
        return (f"{where}: {path}{resolved} is inside {mask}, which holds tco's own files (spool, credentials, "
                "state or a runner's private directory); the agent may not see it")
    return None


def refusals(policy: Any, *, masked_paths: Iterable[str], state_paths: Iterable[str] = (),
             shared_paths: Iterable[str] = (), runtime: str = "bubblewrap",
             registered: Iterable[Mapping[str, Any]] = (), interpreter: str | None = None,
             fs: HostFS | None = None, code_root: str | None = None) -> list[str]:
    """Every reason the runner refuses ``policy`` at run time; empty if it runs it.

    ``policy``: a :class:`~execution.sandbox.policy.Policy`, its YAML text or a mapping
    (an invalid one gives its :class:`~execution.sandbox.policy.PolicyError` problems);
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
    run on a stand-in plan); ``code_root``: tco's code directory, :data:`CODE_ROOT` when None
    (read-only paths inside it are not refused for lying in a scratch directory, see
    :func:`path_refusal`). Pure apart from reading the host's links and mounts through ``fs``."""
    from execution.sandbox.policy import Policy, PolicyError, load_policy

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
        reasons += _relay_refusals(policy, masked_paths=masked_paths, state_paths=state_paths,
                                   shared_paths=shared_paths, interpreter=interpreter, fs=fs, code=code[0])
    return reasons


def _relay_refusals(policy: Any, *, masked_paths: Iterable[str], state_paths: Iterable[str],
                    shared_paths: Iterable[str], interpreter: str, fs: HostFS, code: str) -> list[str]:
    """What the bubblewrap argv builder refuses for ``policy`` once its paths pass (the relay's
    ``interpreter`` not shown inside), asked of the builder itself with a stand-in plan
    (no file descriptors or directories are used: it only computes the argv)."""
    from execution.sandbox.bwrap import SandboxConfigError, SandboxPlan, build_argv

    plan = SandboxPlan(policy=policy, workdir="/nonexistent/work", socket_dir="/nonexistent/socket",
                       agent_argv=[], env={}, masks=list(masked_paths), interpreter=interpreter, status_fd=3,
                       json_status_fd=4, stdout_fd=5, stderr_fd=6, state=list(state_paths),
                       shared=list(shared_paths), code_root=code)
    try:
        build_argv(plan, fs)
    except SandboxConfigError as exc:
        return [str(exc)]
    return []
