"""Issue 23, finding 8: the sandbox's default seccomp filter (execution/sandbox/seccomp.py).

The calls tried inside are ones an unprivileged process makes on this host without the filter
(keyctl and ptrace(PTRACE_TRACEME) succeed, io_uring_setup fails with EFAULT, an x32 call with
ENOSYS): with it each fails with EPERM, while ordinary calls and the demo agent work.
"""
from __future__ import annotations

import json
import platform
import re
import struct
import sys
from pathlib import Path

import pytest

from execution.sandbox import seccomp
from tests.support.runner import Spool

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the deny-list is x86_64's")

# Each call's result and errno, from inside the sandbox, as JSON on stdout.
PROBE = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return [r, ctypes.get_errno()]
status = open('/proc/self/status').read()
print(json.dumps({
    "keyctl": call(250, 0, -3, 0),             # KEYCTL_GET_KEYRING_ID of the session keyring
    "ptrace": call(101, 0, 0, 0, 0),           # PTRACE_TRACEME
    "io_uring_setup": call(425, 1, 0),         # a NULL params: EFAULT without the filter
    "x32_getpid": call(0x40000000 | 39),       # getpid under the x32 ABI
    "getpid": call(39),
    "seccomp": [l.split()[1] for l in status.splitlines() if l.startswith('Seccomp:')][0],
}))
"""


def test_the_program_is_well_formed_and_names_the_kernels_numbers():
    code = seccomp.program("x86_64")
    assert len(code) < 4096 and code[-2][3] == seccomp.SECCOMP_RET_ALLOW
    assert code[-1][3] == 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
    # Every jump lands inside the program.
    for pc, (op, jt, jf, _) in enumerate(code):
        if op in (seccomp.JEQ_K, seccomp.JGE_K):
            assert pc + 1 + jt < len(code) and pc + 1 + jf < len(code)
    assert seccomp.program("aarch64") is None and seccomp.program_bytes("aarch64") is None
    assert len(seccomp.program_bytes("x86_64")) == 8 * len(code)
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if header.exists():
        numbers = dict(re.findall(r"#define __NR_(\w+) (\d+)", header.read_text()))
        for name, number in seccomp.DENIED_X86_64.items():
            if name in numbers:
                assert int(numbers[name]) == number, name


def run_bpf(code, nr: int, arch: int = seccomp.AUDIT_ARCH_X86_64) -> int:
    """A classic BPF interpreter for the few opcodes the program uses (an independent check)."""
    data = struct.pack("=iI", nr, arch)
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == seccomp.LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif op in (seccomp.JEQ_K, seccomp.JGE_K):
            hit = acc == k if op == seccomp.JEQ_K else acc >= k
            pc += 1 + (jt if hit else jf)
        elif op == seccomp.RET_K:
            return k


def test_the_program_denies_exactly_the_list():
    code = seccomp.program("x86_64")
    deny = 0x00050000 | 1
    denied = set(seccomp.DENIED_X86_64.values())
    for nr in range(0, 460):
        assert run_bpf(code, nr) == (deny if nr in denied else seccomp.SECCOMP_RET_ALLOW), nr
    assert run_bpf(code, 0x40000000 | 39) == deny          # x32
    assert run_bpf(code, 20, arch=0x40000003) == deny      # i386 (AUDIT_ARCH_I386)


def test_inside_the_sandbox_the_denied_calls_fail_with_eperm_and_the_rest_work(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.write([{"task": 1}], command=[sys.executable, "-c", PROBE])
    result = spool.run(1)
    record = spool.record(1)
    assert result.returncode == 0, record
    seen = json.loads((spool.root / "records" / "c-1" / "1.stdout").read_text())
    for name in ("keyctl", "ptrace", "io_uring_setup", "x32_getpid"):
        assert seen[name] == [-1, 1], (name, seen[name])   # EPERM
    assert seen["getpid"][0] > 0 and seen["seccomp"] == "2"
    assert record["sandbox"]["seccomp"] is True


def test_the_demo_agent_runs_under_the_filter(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.write([{"task": 1, "duration_s": 0}])
    result = spool.run(1)
    record = spool.record(1)
    assert result.returncode == 0 and record["flags"] == [] and record["sandbox"]["seccomp"] is True
