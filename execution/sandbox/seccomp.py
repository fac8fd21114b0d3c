"""The sandbox's default seccomp filter: a classic BPF program for bubblewrap's ``--seccomp FD``.

A deny-list (issue 23, finding 8): the system calls an agent never needs and that reach the
kernel's riskiest code (modules, kexec, mounts, swap, reboot, BPF, perf, keyrings,
userfaultfd, io_uring, ptrace and reading other processes' memory, clock and quota changes)
fail with EPERM; everything else is allowed. The program checks the architecture first: on an
x86_64 host, the x32 ABI (numbers with bit 30 set) and 32-bit calls (``int 0x80``, another
audit architecture) are refused whole, so a denied call cannot be made under another number.

Built here with the standard library (no libseccomp binding is needed on the exec hosts); only
x86_64 has the numbers: :func:`program` returns None elsewhere and the sandbox runs without
the filter (the runner notes it). See docs/limits.md.
"""
from __future__ import annotations

import errno
import platform
import struct

__all__ = ["DENIED_X86_64", "program", "program_bytes"]

#: System call name -> number on x86_64 (asm/unistd_64.h).
DENIED_X86_64 = {
    "ptrace": 101, "syslog": 103, "uselib": 134,
    "vhangup": 153, "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "acct": 163, "settimeofday": 164,
    "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
    "create_module": 174, "init_module": 175, "delete_module": 176, "get_kernel_syms": 177, "query_module": 178,
    "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "quotactl_fd": 443,
}

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h) and seccomp return values.
LD_W_ABS = 0x20        # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15           # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35           # BPF_JMP | BPF_JGE | BPF_K
RET_K = 0x06           # BPF_RET | BPF_K
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
OFFSET_NR, OFFSET_ARCH = 0, 4  # struct seccomp_data


def program(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter as ``(code, jt, jf, k)`` instructions for ``machine`` (default this host's),
    or None when there is no deny-list for it."""
    if (machine or platform.machine()) not in ("x86_64", "amd64"):
        return None
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    numbers = sorted(set(DENIED_X86_64.values()))
    # Layout: 0 load arch; 1 arch == x86_64 ? next : deny; 2 load nr; 3 nr >= x32 bit ? deny : next;
    # 4.. one "nr == N ? deny : next" each; then allow; then deny.
    n = len(numbers)
    deny_at = 4 + n + 1
    code = [(LD_W_ABS, 0, 0, OFFSET_ARCH),
            (JEQ_K, 0, deny_at - 2, AUDIT_ARCH_X86_64),
            (LD_W_ABS, 0, 0, OFFSET_NR),
            (JGE_K, deny_at - 4, 0, X32_SYSCALL_BIT)]
    for i, number in enumerate(numbers):
        here = 4 + i
        code.append((JEQ_K, deny_at - here - 1, 0, number))
    code.append((RET_K, 0, 0, SECCOMP_RET_ALLOW))
    code.append((RET_K, 0, 0, deny))
    assert all(jt < 256 and jf < 256 for _, jt, jf, _ in code)
    return code


def program_bytes(machine: str | None = None) -> bytes | None:
    """:func:`program` as bubblewrap reads it (``struct sock_filter`` array, native byte order)."""
    code = program(machine)
    if code is None:
        return None
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in code)
