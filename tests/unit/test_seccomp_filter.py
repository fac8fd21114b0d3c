"""Issue 23, finding 8: the sandbox's seccomp deny-list (execution/sandbox/seccomp.py), built with libseccomp.

The rule list is checked against the kernel's own numbers (asm/unistd_64.h) and against the calls
the finding and Docker's and systemd's groups name; the BPF program libseccomp exports is run by a
small classic-BPF interpreter written here (an independent reading of what the kernel would do) for
each call, the argument rules, the x32 and 32-bit ABIs. The socket families are also checked by the
kernel itself: a child process loads the built filter and makes the calls (the AF_VSOCK attack).
In the real sandbox: tests/host/sandbox/test_sandbox_seccomp.py.
"""
from __future__ import annotations

import errno
import json
import os
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from execution.sandbox import seccomp

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the numbers checked are x86_64's")

ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003
X32 = 0x40000000
UNISTD_64 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")

#: What the finding, Docker's default profile and systemd's groups name (typed here, not imported).
MUST_DENY = {"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "mount", "umount2",
             "pivot_root", "swapon", "swapoff", "reboot", "ptrace", "process_vm_readv", "process_vm_writev",
             "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "open_by_handle_at",
             "name_to_handle_at", "setns", "iopl", "ioperm", "acct", "settimeofday", "clock_settime", "adjtimex",
             "clock_adjtime", "io_uring_setup", "fsopen", "fsmount", "move_mount", "open_tree", "quotactl",
             "syslog", "chroot", "pidfd_getfd", "kcmp", "modify_ldt"}
#: Calls every program makes: never refused.
MUST_ALLOW = {"read", "write", "openat", "close", "mmap", "mprotect", "brk", "exit_group", "getpid", "execve",
              "wait4", "futex", "rt_sigaction", "prctl", "prlimit64", "seccomp", "connect", "fork",
              "vfork", "kill", "getrandom", "statx", "pipe2", "dup3", "fcntl", "madvise", "sched_yield"}


def kernel_numbers() -> dict[str, int]:
    return {name: int(nr) for name, nr in re.findall(r"#define __NR_(\w+) (\d+)", UNISTD_64.read_text())}


def run_bpf(program: bytes, nr: int, *args: int, arch: int = AUDIT_ARCH_X86_64) -> int:
    """What a classic BPF seccomp program returns for ``struct seccomp_data`` {nr, arch, ip 0, args}:
    the opcodes libseccomp emits (loads, AND, jumps on K, returns); any other fails the test."""
    argv = [*args, *[0] * (6 - len(args))]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *[a & 0xFFFFFFFFFFFFFFFF for a in argv])
    code = [struct.unpack_from("=HBBI", program, 8 * i) for i in range(len(program) // 8)]
    pc, acc = 0, 0
    for _ in range(10_000):
        op, jt, jf, k = code[pc]
        if op == 0x20:                       # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif op == 0x54:                     # BPF_ALU | BPF_AND | BPF_K
            acc &= k
            pc += 1
        elif op in (0x15, 0x25, 0x35, 0x45):  # BPF_JMP | JEQ / JGT / JGE / JSET, BPF_K
            hit = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += 1 + (jt if hit else jf)
        elif op == 0x05:                     # BPF_JMP | BPF_JA
            pc += 1 + k
        elif op == 0x06:                     # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"opcode {op:#x} at {pc} is not read by this interpreter")
    raise AssertionError("the program did not return")


@pytest.fixture(scope="module")
def program() -> bytes:
    return seccomp.program_bytes()


def test_the_list_names_the_dangerous_calls_by_the_kernels_numbers():
    names = seccomp.denied_names()
    assert MUST_DENY <= set(names)
    assert not (MUST_ALLOW & set(names))
    assert {"unshare", "clone", "clone3", "personality", "socket", "socketpair"} <= set(names)
    assert seccomp.description() == f"default deny-list, {len(names)} calls" and len(names) == len(set(names))
    assert seccomp.description("off") == "off"
    lib = seccomp.binding()
    numbers = kernel_numbers() if UNISTD_64.exists() else {}
    for name in names:
        nr = lib.resolve_syscall(lib.Arch.X86_64, name)
        assert nr >= 0, name
        if name in numbers:
            assert numbers[name] == nr, name


def test_each_listed_call_fails_with_eperm_and_no_other(program):
    numbers = kernel_numbers()
    denied = {numbers[n] for names in seccomp.DENIED.values() for n in names if n in numbers}
    assert len(denied) >= len(MUST_DENY)
    conditional = {numbers[n] for n in seccomp.BY_ARGUMENT}
    for nr in range(0, 470):
        if nr in conditional:
            continue
        assert run_bpf(program, nr) == (EPERM if nr in denied else ALLOW), nr
    for name in MUST_ALLOW:
        assert run_bpf(program, numbers[name]) == ALLOW, name


@pytest.mark.parametrize("flags, expected", [
    (0x10000000, EPERM),            # CLONE_NEWUSER
    (0x00020000, EPERM),            # CLONE_NEWNS
    (0x40000000, EPERM),            # CLONE_NEWNET
    (0x20000000 | 0x400, EPERM),    # CLONE_NEWPID | CLONE_FS
    (0x00000080, EPERM),            # CLONE_NEWTIME
    (0x00000400, ALLOW),            # CLONE_FILES: no namespace
    (0, ALLOW),
    (1 << 32 | 0x10000000, EPERM),  # the upper half changes nothing
])
def test_unshare_is_refused_for_new_namespaces_only(program, flags, expected):
    assert run_bpf(program, kernel_numbers()["unshare"], flags) == expected


@pytest.mark.parametrize("flags, expected", [
    (17, ALLOW),                                     # fork: SIGCHLD
    (0x003D0F00, ALLOW),                             # a pthread's flags
    (17 | 0x80, ALLOW),                              # 0x80 is the exit signal here, not CLONE_NEWTIME
    (17 | 0x10000000, EPERM), (17 | 0x08000000, EPERM), (17 | 0x02000000, EPERM), (17 | 0x04000000, EPERM),
])
def test_clone_is_refused_for_new_namespaces_only(program, flags, expected):
    assert run_bpf(program, kernel_numbers()["clone"], flags) == expected


def test_clone3_says_enosys_so_the_c_library_uses_clone(program):
    assert run_bpf(program, kernel_numbers()["clone3"]) == ENOSYS


@pytest.mark.parametrize("persona, expected", [
    (0xFFFFFFFF, ALLOW),                  # the query
    (0, ALLOW), (0x0008, ALLOW), (0x0020000, ALLOW), (0x0020008, ALLOW),  # PER_LINUX, PER_LINUX32, UNAME26
    (0x0040000, EPERM),                   # ADDR_NO_RANDOMIZE
    (0x0400000, EPERM),                   # READ_IMPLIES_EXEC
    (0x0100000, EPERM),                   # MMAP_PAGE_ZERO
    (0x0200000, EPERM),                   # ADDR_COMPAT_LAYOUT
    (0x0040008, EPERM),
    (0x80040000, EPERM),                  # with bit 31 set
    (0xFFFFFFFE, EPERM),                  # everything but the query
    (0xFFFBFFFF, EPERM),
    (0x1_0004_0000, EPERM),               # the kernel reads 32 bits: ADDR_NO_RANDOMIZE
    (0x1_FFFF_FFFF, ALLOW),               # ... the query
])
def test_personality_cannot_weaken_the_address_space(program, persona, expected):
    assert run_bpf(program, kernel_numbers()["personality"], persona) == expected


#: Address families (linux/socket.h, typed here): those the sandbox's relay and agents use.
FAMILIES_ALLOWED = {1, 2, 10, 16}          # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
AF_VSOCK, AF_PACKET, AF_ALG, AF_BLUETOOTH = 40, 17, 38, 31


@pytest.mark.parametrize("call", ["socket", "socketpair"])
def test_socket_is_refused_for_every_family_but_unix_inet_inet6_netlink(program, call):
    nr = kernel_numbers()[call]
    for family in range(0, 70):
        expected = ALLOW if family in FAMILIES_ALLOWED else EPERM
        assert run_bpf(program, nr, family, 1, 0) == expected, family
    assert run_bpf(program, nr, AF_VSOCK, 1, 0) == EPERM
    for family in (0xFFFFFFFF, 0x80000000, 0x10000, 1 << 31 | 2, -1):   # negative or large ints
        assert run_bpf(program, nr, family, 1, 0) == EPERM, family
    # The kernel reads an int: the upper half of the register changes nothing.
    assert run_bpf(program, nr, 1 << 32 | 2, 1, 0) == ALLOW
    assert run_bpf(program, nr, 1 << 32 | AF_VSOCK, 1, 0) == EPERM
    assert run_bpf(program, nr, 0xFFFFFFFF_00000000 | 10, 1, 0) == ALLOW


# Loads the built filter in this child process, then makes the calls; each [errno or 0], as JSON.
SOCKET_PROBE = r"""
import errno, json, socket, sys
if sys.argv[1] == "filter":
    from execution.sandbox import seccomp
    seccomp.build_filter().load()
def attempt(make):
    try:
        for s in make():
            s.close()
        return 0
    except OSError as exc:
        return exc.errno
def vsock_listener():
    s = socket.socket(40, socket.SOCK_STREAM, 0)       # AF_VSOCK
    s.bind((0xFFFFFFFF, 47001))                         # VMADDR_CID_ANY, the attack's port
    s.listen()
    return [s]
seen = {
    "vsock": attempt(vsock_listener),
    "vsock_dgram": attempt(lambda: [socket.socket(40, socket.SOCK_DGRAM, 0)]),
    "vsock_pair": attempt(lambda: socket.socketpair(40, socket.SOCK_STREAM, 0)),
    "alg": attempt(lambda: [socket.socket(38, socket.SOCK_SEQPACKET, 0)]),          # AF_ALG
    "unix": attempt(lambda: [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)]),
    "unix_pair": attempt(lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)),
    "inet": attempt(lambda: [socket.socket(socket.AF_INET, socket.SOCK_STREAM)]),
    "inet6": attempt(lambda: [socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)]),
    "netlink": attempt(lambda: [socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)]),   # NETLINK_ROUTE
}
print(json.dumps(seen))
"""


def socket_probe(mode: str) -> dict:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", SOCKET_PROBE, mode], capture_output=True, text=True, env=env,
                          cwd=root, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_under_the_filter_an_agent_cannot_listen_on_vsock_and_its_own_sockets_work():
    """The attack: socket(AF_VSOCK, SOCK_STREAM, 0), bind to port 47001, listen. Under the built
    filter (loaded by the child itself, as bubblewrap loads it) it fails with EPERM at socket();
    AF_UNIX (and its socketpair), AF_INET, AF_INET6 and AF_NETLINK still work."""
    seen = socket_probe("filter")
    for name in ("vsock", "vsock_dgram", "vsock_pair", "alg"):
        assert seen[name] == errno.EPERM, (name, seen)
    for name in ("unix", "unix_pair", "inet", "inet6", "netlink"):
        assert seen[name] == 0, (name, seen)


def test_without_the_filter_the_probe_sees_what_the_kernel_gives():
    """The same probe unfiltered: AF_UNIX and AF_INET work and no socket call fails with EPERM (a
    host without the vsock module says EAFNOSUPPORT; with it, as the attack saw, the listener works),
    so the EPERM above is the filter's."""
    seen = socket_probe("none")
    assert seen["unix"] == 0 and seen["inet"] == 0 and seen["unix_pair"] == 0
    assert errno.EPERM not in (seen["vsock"], seen["vsock_dgram"], seen["alg"]), seen


def test_other_abis_are_refused_whole(program):
    numbers = kernel_numbers()
    assert run_bpf(program, X32 | numbers["getpid"]) == EPERM
    assert run_bpf(program, X32 | 521) == EPERM             # x32's ptrace
    assert run_bpf(program, 20, arch=AUDIT_ARCH_I386) == EPERM  # i386 getpid
    assert run_bpf(program, numbers["getpid"], arch=AUDIT_ARCH_I386) == EPERM


def test_the_setting(monkeypatch):
    assert seccomp.seccomp_mode({}) == "default" and seccomp.seccomp_mode({"TCO_SANDBOX_SECCOMP": ""}) == "default"
    assert seccomp.seccomp_mode({"TCO_SANDBOX_SECCOMP": " off "}) == "off"
    for bad in ("on", "0", "OFF", "none"):
        with pytest.raises(ValueError, match="TCO_SANDBOX_SECCOMP"):
            seccomp.seccomp_mode({"TCO_SANDBOX_SECCOMP": bad})


def test_without_the_binding_it_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "seccomp", None)   # import seccomp raises ImportError
    monkeypatch.setattr(seccomp, "DEBIAN_DIST_PACKAGES", str(tmp_path))
    with pytest.raises(seccomp.SeccompUnavailable, match="python3-seccomp.*TCO_SANDBOX_SECCOMP=off"):
        seccomp.program_bytes()


def test_debians_binding_is_found_outside_the_venv(monkeypatch):
    """The venv does not see Debian's packages: the binding comes from dist-packages by path."""
    if not list(Path(seccomp.DEBIAN_DIST_PACKAGES).glob("seccomp.*.so")):
        pytest.skip("Debian's python3-seccomp is not installed")
    monkeypatch.setitem(sys.modules, "seccomp", None)
    lib = seccomp.binding()
    assert lib.__file__.startswith(seccomp.DEBIAN_DIST_PACKAGES)
    assert seccomp.program_bytes(lib) == seccomp.program_bytes()
