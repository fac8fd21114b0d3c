"""Fresh attack A6 (issue 23): after `make stop` another local account bound the demo's web port
(TCO_PORT, 8000, unprivileged) and served its own page there; a `scripts/services start` then could
not bind it, yet its health probe got the impostor's 200 and reported tco up.

scripts/check-listener tells whose socket listens on a port; scripts/services runs it before it
starts the web server, after the health probe, and in `status`. Here the attack's listener is held
by another account (tco-probe) and by tco, and the check is asked.
"""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HOLD = ("import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen();"
        "print('bound', flush=True); sys.stdin.readline()")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(port: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts/check-listener"), str(port)], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TCO_USER": "tco"})


class Held:
    """``user`` listens on 127.0.0.1:``port`` until the block ends."""

    def __init__(self, user: str, port: int) -> None:
        self.proc = subprocess.Popen(["runuser", "-u", user, "--", "/usr/bin/python3", "-c", HOLD, str(port)],
                                     cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __enter__(self):
        assert self.proc.stdout.readline().strip() == "bound"
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def test_another_accounts_listener_on_the_web_port_is_named_and_refused(probe_account):
    port = free_port()
    with Held(probe_account, port):
        out = check(port)
    assert out.returncode == 1, out
    uid = subprocess.check_output(["id", "-u", probe_account], text=True).strip()
    assert f"{probe_account} (uid {uid})" in out.stderr and f"127.0.0.1:{port}" in out.stderr, out
    assert "not tco's" in out.stderr


def test_tcos_own_listener_and_a_free_port_pass():
    port = free_port()
    with Held("tco", port):
        out = check(port)
    assert (out.returncode, out.stdout.strip()) == (0, "tco's"), out
    free = check(free_port())
    assert (free.returncode, free.stdout.strip()) == (0, "free"), free


@pytest.mark.parametrize("bad", ["", "0", "65536", "80; id", "-1"])
def test_a_bad_port_is_refused_and_never_reaches_a_shell(bad):
    out = check(bad)  # type: ignore[arg-type]
    assert out.returncode == 2 and "usage" in out.stderr, out


def test_services_refuses_to_start_beside_and_to_trust_another_accounts_server():
    """scripts/services asks the check before it starts the web server and after its health probe."""
    text = (REPO / "scripts/services").read_text()
    start = text.index("start)")
    web = text.index("start_one web", start)
    before, probe = text.rindex("scripts/check-listener", start, web), text.index("/healthz", web)
    assert start < before < web < probe < text.index("scripts/check-listener", probe)
