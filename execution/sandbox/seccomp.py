"""The sandbox's default seccomp filter, built with libseccomp, for bubblewrap's ``--seccomp FD``.

A deny-list (issue 23, finding 8): the system calls an agent never needs and that reach the
kernel's riskiest code fail with EPERM; everything else is allowed. The list follows Docker's
default profile and systemd's ``@module``, ``@reboot``, ``@swap``, ``@mount``, ``@raw-io``,
``@clock``, ``@debug``, ``@cpu-emulation`` and ``@obsolete`` groups (:data:`DENIED`, by group).
Five calls are refused only for some arguments (:data:`BY_ARGUMENT`):

- ``unshare`` and ``clone`` asking for a new namespace (any ``CLONE_NEW*`` flag, :data:`NAMESPACE_FLAGS`);
  bubblewrap has made the sandbox's namespaces before it loads the filter, and the agent's
  ordinary ``fork``, threads and ``unshare(CLONE_FILES)`` still work;
- ``personality`` setting a flag that weakens the address space (no address randomisation,
  readable-implies-executable, a mapping at page zero, the legacy layout: :data:`PERSONALITY_FLAGS`);
  the query ``personality(0xffffffff)`` and the plain personas still work;
- ``socket`` and ``socketpair`` for an address family other than :data:`SOCKET_FAMILIES` (AF_UNIX,
  AF_INET, AF_INET6, AF_NETLINK: the relay's and the agents' sockets, and the C library's netlink
  queries); the network namespace does not isolate the others, AF_VSOCK above all (a found attack
  bound and listened on vsock port 47001: on a virtual-machine execution host that reaches, or
  squats, the hypervisor's channels);
- ``clone3`` fails with ENOSYS (its flags are in memory a filter cannot read): the C library
  then falls back to ``clone``, whose flags the filter reads, as under Docker.

libseccomp (Debian's ``libseccomp2``, through its own Python binding, Debian's ``python3-seccomp``)
resolves each name to this host's numbers and writes the BPF program. A call made under another
ABI is refused whole (the filter's bad-architecture action is EPERM): 32-bit x86 (``int 0x80``)
and x32 on an x86_64 host, arm's compat ABI on aarch64; so no denied call is reachable under
another number.

The runner builds the program at its start (:func:`program_bytes`, a few milliseconds) unless the
site turned the filter off (``TCO_SANDBOX_SECCOMP=off``, :func:`seccomp_mode`); without the binding
the task ends with a configuration error that says what to install, never an unfiltered sandbox.
See docs/limits.md ("The seccomp filter").
"""
from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import os
from collections.abc import Mapping
from types import ModuleType

__all__ = ["DENIED", "BY_ARGUMENT", "NAMESPACE_FLAGS", "PERSONALITY_FLAGS", "PERSONALITY_QUERY", "SECCOMP_MODES",
           "SOCKET_FAMILIES",
           "SeccompUnavailable", "binding", "build_filter", "denied_names", "description", "program_bytes",
           "seccomp_mode"]

#: Calls refused whole (EPERM), by the group that names them.
DENIED: dict[str, tuple[str, ...]] = {
    "kernel modules and kexec": ("init_module", "finit_module", "delete_module", "create_module",
                                 "get_kernel_syms", "query_module", "kexec_load", "kexec_file_load"),
    "mounts": ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
               "fsmount", "fspick", "mount_setattr"),
    "swap and reboot": ("swapon", "swapoff", "reboot"),
    "other processes' memory and descriptors": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
                                                "pidfd_getfd"),
    "kernel keyrings": ("add_key", "request_key", "keyctl"),
    "BPF, perf, userfaultfd, io_uring": ("bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
                                         "io_uring_enter", "io_uring_register", "lookup_dcookie"),
    "file handles": ("name_to_handle_at", "open_by_handle_at"),
    "joining namespaces": ("setns",),
    "raw I/O and CPU emulation": ("iopl", "ioperm", "modify_ldt"),
    "clock": ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex"),
    "system administration": ("acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "sethostname",
                              "setdomainname", "fanotify_init", "nfsservctl", "_sysctl", "uselib", "ustat",
                              "sysfs"),
}
#: ``CLONE_NEW*`` flags (linux/sched.h): mount, cgroup, UTS, IPC, user, PID, network; time (0x80)
#: for ``unshare`` only (in ``clone``'s flags 0x80 is part of the exit signal).
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}
CLONE_NEWTIME = 0x00000080
#: ``personality`` flags refused (linux/personality.h).
PERSONALITY_FLAGS = {"ADDR_NO_RANDOMIZE": 0x0040000, "MMAP_PAGE_ZERO": 0x0100000,
                     "ADDR_COMPAT_LAYOUT": 0x0200000, "READ_IMPLIES_EXEC": 0x0400000}
#: ``personality(0xffffffff)`` reads the persona without changing it.
PERSONALITY_QUERY = 0xFFFFFFFF
#: The address families ``socket`` and ``socketpair`` may ask for (linux/socket.h: AF_UNIX 1,
#: AF_INET 2, AF_INET6 10, AF_NETLINK 16); any other fails with EPERM (socket(2): the family is
#: its first argument, an int). EPERM, not the kernel's EAFNOSUPPORT, so a refusal is told apart
#: from a family this kernel lacks.
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
#: Calls refused for some arguments only (module doc), and the errno they fail with.
BY_ARGUMENT = {"unshare": "EPERM", "clone": "EPERM", "personality": "EPERM", "socket": "EPERM",
               "socketpair": "EPERM", "clone3": "ENOSYS"}
#: ``TCO_SANDBOX_SECCOMP``: the default deny-list (first, the default) or none.
SECCOMP_MODES = ("default", "off")
#: Where Debian's python3-seccomp puts the binding (outside a virtual environment's path).
DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"


class SeccompUnavailable(RuntimeError):
    """libseccomp's Python binding cannot be loaded here; the message says what to install."""


def seccomp_mode(environ: Mapping[str, str]) -> str:
    """``TCO_SANDBOX_SECCOMP``: ``default`` (unset or empty: the deny-list) or ``off``. Raises
    ValueError naming the setting for anything else."""
    value = (environ.get("TCO_SANDBOX_SECCOMP") or SECCOMP_MODES[0]).strip()
    if value not in SECCOMP_MODES:
        raise ValueError(f"TCO_SANDBOX_SECCOMP={value!r}: expected one of {', '.join(SECCOMP_MODES)}")
    return value


def binding() -> ModuleType:
    """libseccomp's own Python binding (``import seccomp``): from this interpreter's path, else
    Debian's python3-seccomp in :data:`DEBIAN_DIST_PACKAGES` (a virtual environment does not see
    it; only this one module is loaded from there, and only if it was built for this Python).
    Raises :class:`SeccompUnavailable`."""
    try:
        import seccomp  # noqa: PLC0415 - optional, the host's

        return seccomp
    except ImportError:
        pass
    spec = importlib.machinery.PathFinder.find_spec("seccomp", [DEBIAN_DIST_PACKAGES])
    if spec is None or spec.loader is None:
        raise SeccompUnavailable("libseccomp's Python binding is not installed on this exec host "
                                 "(Debian: apt-get install python3-seccomp); or set TCO_SANDBOX_SECCOMP=off")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise SeccompUnavailable(f"libseccomp's Python binding cannot be loaded: {exc}") from None
    return module


def denied_names() -> list[str]:
    """Every call the filter names (refused whole or for some arguments), sorted."""
    return sorted({name for names in DENIED.values() for name in names} | set(BY_ARGUMENT))


def description(mode: str = "default") -> str:
    """What the record says of the filter: ``"default deny-list, N calls"`` or ``"off"``."""
    return f"default deny-list, {len(denied_names())} calls" if mode == "default" else "off"


def build_filter(lib: ModuleType | None = None):
    """The filter (a ``seccomp.SyscallFilter``, not loaded) for this host's architecture: default
    allow; :data:`DENIED` and the argument rules of :data:`BY_ARGUMENT` fail with their errno;
    calls of any other ABI fail with EPERM. ``lib``: the binding (default :func:`binding`).
    Raises :class:`SeccompUnavailable`, and libseccomp's RuntimeError for a name it does not know."""
    sc = lib or binding()
    eperm = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, eperm)
    for names in DENIED.values():
        for name in names:
            f.add_rule(eperm, name)
    # One rule per flag: libseccomp ORs the rules of a call, and ANDs the comparisons of a rule.
    for flag in [*NAMESPACE_FLAGS.values(), CLONE_NEWTIME]:
        f.add_rule(eperm, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone's flags are its first argument, except on s390 (second).
    flags_arg = 1 if os.uname().machine.startswith("s390") else 0
    for flag in NAMESPACE_FLAGS.values():
        f.add_rule(eperm, "clone", sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # personality(2) takes an unsigned int: the upper half of the register is ignored, and so are
    # the masks' upper halves. A refused flag with bit 31 clear is refused; with bit 31 set, every
    # value but the query (all 32 bits set) is refused by the rules for bits 0..30, so no value that
    # sets a refused flag gets through.
    for flag in PERSONALITY_FLAGS.values():
        f.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, flag | 0x80000000, flag))
    for bit in range(31):
        f.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, 0x80000000 | (1 << bit), 0x80000000))
    # socket(2) and socketpair(2): the family is an int, so only the lower 32 bits count (as for
    # personality). A family of 32 or more (a negative one included) sets a bit from 5 to 31: one
    # rule per bit; each family below 32 that is not allowed: one rule for its exact value.
    for name in ("socket", "socketpair"):
        for bit in range(5, 32):
            f.add_rule(eperm, name, sc.Arg(0, sc.MASKED_EQ, 1 << bit, 1 << bit))
        for family in sorted(set(range(32)) - set(SOCKET_FAMILIES.values())):
            f.add_rule(eperm, name, sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, family))
    return f


def program_bytes(lib: ModuleType | None = None) -> bytes:
    """:func:`build_filter` as bubblewrap reads it: the BPF program (``struct sock_filter`` array)
    that libseccomp exports. Raises :class:`SeccompUnavailable` (and OSError)."""
    f = build_filter(lib)
    fd = os.memfd_create("tco-seccomp", os.MFD_CLOEXEC)
    with open(fd, "w+b") as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
