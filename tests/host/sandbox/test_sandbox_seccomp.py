"""Issue 23, finding 8: the sandbox's default seccomp filter (execution/sandbox/seccomp.py), in the real sandbox.

An agent started by the runner in bubblewrap makes the calls through ctypes. With the filter
(the default) each dangerous one fails with EPERM (``socket`` and ``socketpair`` for AF_VSOCK
too) and /proc/self/status says ``Seccomp: 2``, while threads, fork, a child Python, AF_UNIX,
AF_INET, AF_INET6 and AF_NETLINK sockets and the demo agent work; with ``TCO_SANDBOX_SECCOMP=off``
the same agent sees keyctl, ptrace and personality succeed (what the finding saw: ``Seccomp: 0``).
The rule list and its BPF program: tests/unit/test_seccomp_filter.py.
"""
from __future__ import annotations

import json
import platform
import sys

import pytest

from execution.sandbox import seccomp

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe's numbers are x86_64's")

# Each call's [result, errno], from inside the sandbox, as JSON on stdout.
PROBE = r"""
import ctypes, json, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return [r, ctypes.get_errno()]
status = open('/proc/self/status').read()
seen = {
    "keyctl": call(250, 0, -3, 0),                 # KEYCTL_GET_KEYRING_ID of the session keyring
    "mount": call(165, 0, 0, 0, 0, 0),
    "unshare_user": call(272, 0x10000000),         # unshare(CLONE_NEWUSER)
    "unshare_net": call(272, 0x40000000),          # unshare(CLONE_NEWNET)
    "unshare_files": call(272, 0x400),             # unshare(CLONE_FILES): no namespace
    "setns": call(308, 0, 0),
    "io_uring_setup": call(425, 1, 0),             # a NULL params: EFAULT without the filter
    "bpf": call(321, 0, 0, 0),
    "personality_no_aslr": call(135, 0x0040000),   # ADDR_NO_RANDOMIZE
    "personality_query": call(135, 0xFFFFFFFF),
    "x32_getpid": call(0x40000000 | 39),           # getpid under the x32 ABI
    "getpid": call(39),
    "socket_vsock": call(41, 40, 1, 0),            # socket(AF_VSOCK, SOCK_STREAM, 0): the vsock attack
    "socketpair_vsock": call(53, 40, 1, 0, 0),     # a NULL sv: EFAULT, or EOPNOTSUPP, without the filter
    "socket_unix": call(41, 1, 1, 0),              # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK still work
    "socket_inet": call(41, 2, 1, 0),
    "socket_inet6": call(41, 10, 2, 0),
    "socket_netlink": call(41, 16, 3, 0),
    "seccomp": [l.split()[1] for l in status.splitlines() if l.startswith('Seccomp:')][0],
}
t = threading.Thread(target=lambda: seen.setdefault("thread", "ran")); t.start(); t.join()
child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid() > 0)"], capture_output=True, text=True)
seen["child"] = [child.returncode, child.stdout.strip()]
seen["ptrace"] = call(101, 0, 0, 0, 0)  # PTRACE_TRACEME, last: a traced process stops at its next signal
print(json.dumps(seen), flush=True)
"""
EPERM = 1


def probe(spool, extra=None) -> tuple[dict, dict]:
    spool.write([{"task": 1}], command=[sys.executable, "-c", PROBE])
    result = spool.run(1, extra=extra)
    record = spool.record(1)
    assert result.returncode == 0, (record, result.stderr)
    return json.loads((spool.root / "records" / spool.campaign_id / "1.stdout").read_text()), record


def test_inside_the_sandbox_the_dangerous_calls_fail_with_eperm_and_the_rest_work(spool):
    seen, record = probe(spool)
    for name in ("keyctl", "ptrace", "mount", "unshare_user", "unshare_net", "setns", "io_uring_setup", "bpf",
                 "personality_no_aslr", "x32_getpid", "socket_vsock", "socketpair_vsock"):
        assert seen[name] == [-1, EPERM], (name, seen[name])
    for name in ("socket_unix", "socket_inet", "socket_inet6", "socket_netlink"):
        assert seen[name][0] > 2 and seen[name][1] == 0, (name, seen[name])
    assert seen["personality_query"] == [0, 0]       # the persona is still PER_LINUX: the refused call changed nothing
    assert seen["unshare_files"] == [0, 0] and seen["getpid"][0] > 0
    assert seen["thread"] == "ran" and seen["child"] == [0, "True"]   # clone3's ENOSYS: the C library used clone
    assert seen["seccomp"] == "2"
    assert record["sandbox"]["seccomp"] == f"default deny-list, {len(seccomp.denied_names())} calls"


def test_the_site_can_turn_it_off(spool):
    seen, record = probe(spool, extra={"TCO_SANDBOX_SECCOMP": "off"})
    assert seen["seccomp"] == "0" and record["sandbox"]["seccomp"] == "off"
    assert seen["keyctl"][0] > 0 and seen["ptrace"] == [0, 0]            # what the finding saw
    assert seen["personality_no_aslr"][0] == 0                            # it returns the old persona
    assert seen["unshare_user"][1] != EPERM                               # bubblewrap's --disable-userns: ENOSPC
    # AF_VSOCK is not isolated by the network namespace: a descriptor (EAFNOSUPPORT without the vsock module)
    assert seen["socket_vsock"][1] != EPERM


def test_a_wrong_setting_is_a_configuration_error(spool):
    spool.write([{"task": 1}])
    result = spool.run(1, extra={"TCO_SANDBOX_SECCOMP": "on"})
    record = spool.record(1)
    assert result.returncode == 78 and "TCO_SANDBOX_SECCOMP='on'" in record["error"]
    assert record["stages"]["agent_started_at"] is None


def test_the_demo_agent_runs_under_the_filter(spool):
    spool.write([{"task": 1, "duration_s": 0}])
    result = spool.run(1)
    record = spool.record(1)
    assert result.returncode == 0 and record["flags"] == [], record
    assert record["sandbox"]["seccomp"].startswith("default deny-list")
