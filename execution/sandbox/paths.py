"""Host paths and the sandbox: what a listed path may not be, compared after links and mounts.

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

:func:`path_refusal` is that check; execution/sandbox/checks.py (the launch
form's and the runner's) and the bubblewrap argv builder (bwrap.py) both ask
it. Standard library only (the runner imports it on every task).
"""
from __future__ import annotations

import os
from collections.abc import Iterable

INSIDE_WORKDIR = "/sandbox"
INSIDE_SOCKET_DIR = "/run/tco"
INSIDE_RELAY = "/run/tco-relay.py"
#: Always the sandbox's own fresh tmpfs; nothing inside the host's may be listed.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/run/lock", "/var/lock")
KERNEL_DIRS = ("/proc", "/dev")
#: tco's own code directory (the repository; this file is execution/sandbox/paths.py in it),
#: resolved. Its paths may be listed read-only even where it lies inside a scratch directory of
#: :data:`PRIVATE_DIRS` (a clone in /tmp): the demo agents' code and venv are there.
CODE_ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

__all__ = ["CODE_ROOT", "HostFS", "PRIVATE_DIRS", "KERNEL_DIRS", "INSIDE_WORKDIR", "INSIDE_SOCKET_DIR", "INSIDE_RELAY",
           "under", "unescape_mountinfo", "path_refusal", "resolve_masks", "private_dir_target"]


def under(path: str, ancestor: str) -> bool:
    """True if ``path`` is ``ancestor`` or inside it (both normalised, absolute)."""
    if ancestor == "/":
        return True
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def unescape_mountinfo(field: str) -> str:
    """A path field of /proc/self/mountinfo as text: proc(5) writes space, tab, newline and
    backslash as \\040, \\011, \\012, \\134."""
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
        """``os.path.lexists``."""
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        """``os.path.isdir``."""
        return os.path.isdir(path)

    def islink(self, path: str) -> bool:
        """``os.path.islink``."""
        return os.path.islink(path)

    def readlink(self, path: str) -> str:
        """``os.readlink``; raises OSError."""
        return os.readlink(path)

    def realpath(self, path: str) -> str:
        """``os.path.realpath``; raises OSError (e.g. a link through /proc/1/root)."""
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
                found.append((fields[2], unescape_mountinfo(fields[3]), unescape_mountinfo(fields[4])))
        return found

    def mount_aliases(self, path: str) -> list[str]:
        """Other host paths where the directory or file ``path`` (canonical) is mounted too
        (bind mounts of it or of a directory above it)."""
        mounts = self.mounts()
        best = None
        for device, root, point in mounts:
            if under(path, point) and (best is None or len(point) >= len(best[2])):
                best = (device, root, point)
        if best is None:
            return []
        device, root, point = best
        inner = os.path.normpath(root.rstrip("/") + "/" + path[len(point):].lstrip("/"))
        aliases = []
        for other_device, other_root, other_point in mounts:
            if other_device != device or not under(inner, other_root):
                continue
            alias = os.path.normpath(other_point.rstrip("/") + "/" + inner[len(other_root.rstrip("/")):].lstrip("/"))
            if alias != path and alias not in aliases:
                aliases.append(alias)
        return aliases


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
        if any(under(shown, k) for k in KERNEL_DIRS) and shown != "/dev/shm":
            return (f"{where}: {path}{resolved}: bubblewrap gives the sandbox its own /proc and /dev; "
                    "nothing in them can be listed")
        if under(shown, INSIDE_SOCKET_DIR) or shown == INSIDE_RELAY:
            return f"{where}: {path}{resolved} is where tco puts its relay; it cannot be listed"
    if real in PRIVATE_DIRS or path in PRIVATE_DIRS:
        return None  # the sandbox's own fresh tmpfs, never the host's
    in_code = any(under(path, c) for c in code) and any(under(real, c) for c in code)
    for shown in dict.fromkeys((path, real)):
        resolved = "" if shown == path else f" (it resolves to {shown})"
        inside = [d for d in PRIVATE_DIRS if under(shown, d) and shown != d]
        if inside and not in_code:
            return (f"{where}: {path}{resolved} is inside {inside[0]}, which holds other tasks' scratch space; "
                    f"the sandbox always has its own {inside[0]} (list {inside[0]} itself for a private one)")
    masks, state = list(masks), list(state)
    if in_code:
        # A scratch directory masked for its other contents (Grid Engine's per-job TMPDIRs are
        # /tmp/<job>.<task>.<queue>, so the runner masks /tmp) does not hide tco's code inside it.
        masks = [m for m in masks if not any(under(c, m) and c != m for c in code)]
    shared = [s for s in shared if any(under(s, m) and s != m for m in state)
              and not any(under(s, m) for m in masks)]
    resolved = f" (it resolves to {real})" if real != path else ""
    for mask in masks + state:
        if not (under(real, mask) or under(path, mask)):
            continue
        if mask in state and not any(under(path, m) or under(real, m) for m in masks) \
                and any(under(real, s) and under(path, s) and under(s, mask) and s != mask for s in shared):
            continue
        return (f"{where}: {path}{resolved} is inside {mask}, which holds tco's own files (spool, credentials, "
                "state or a runner's private directory); the agent may not see it")
    return None
