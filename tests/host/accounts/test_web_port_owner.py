"""Fresh attack A6 (issue 23): after `make stop` another local account bound the demo's web port
(TCO_PORT, 8000, unprivileged) and served its own page there; a `scripts/services start` then could
not bind it, yet its health probe got the impostor's 200 and reported tco up.

scripts/check-listener tells whose socket listens on a port; scripts/services runs it before it
starts the web server, after the health probe, and in `status`. Here the attack's listener is held
by another account (tco-probe) and by tco, and the check is asked.
"""
from __future__ import annotations

import os
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


def test_redis_password_goes_only_to_a_listener_of_redis_or_root(probe_account):
    """Fresh attack (2026-12-03): another account listened on Redis's port while Redis was down and
    received its password with scripts/dev-cluster's AUTH (and would have with the services'). The check
    both ask first (TCO_USER=redis) refuses that account's listener and passes the real Redis."""
    port = free_port()
    with Held(probe_account, port):
        out = subprocess.run([str(REPO / "scripts/check-listener"), str(port)], capture_output=True, text=True,
                             timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TCO_USER": "redis"})
    assert out.returncode == 1 and "not tco's" in out.stderr, out
    redis_port = int(os.environ.get("TCO_REDIS_PORT", "6379"))
    real = subprocess.run([str(REPO / "scripts/check-listener"), str(redis_port)], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TCO_USER": "redis"})
    assert (real.returncode, real.stdout.strip()) == (0, "tco's"), real  # scripts/setup started Redis as redis
    # The check comes before the password is first sent: in start_redis, before redis_up's AUTH; in
    # scripts/services, before the first service starts.
    cluster = (REPO / "scripts/dev-cluster").read_text()
    body = cluster[cluster.index("start_redis() {"):]
    assert body.index("check-listener") < body.index("redis_up")
    services = (REPO / "scripts/services").read_text()
    start = services.index("start)")
    assert start < services.index('TCO_USER=redis "$TCO_REPO/scripts/check-listener" "$TCO_REDIS_PORT"', start) < \
        services.index("start_one ", start)


def _ensure_root_dirs(path: str) -> subprocess.CompletedProcess:
    """scripts/dev-cluster's ensure_root_dirs, run alone (its text cut out of the script)."""
    text = (REPO / "scripts/dev-cluster").read_text()
    body = text[text.index("ensure_root_dirs() {"):]
    body = body[:body.index("\n}\n") + 3]
    script = 'die() { echo "dev-cluster: ERROR: $*" >&2; exit 1; }\n' + body + 'ensure_root_dirs "$1"\n'
    return subprocess.run(["bash", "-c", script, "bash", path], capture_output=True, text=True, timeout=30)


def test_a_hosts_tmpdir_parent_made_first_by_another_account_is_refused(probe_account, tmp_path):
    """Fresh attack (2026-12-03): on a fresh machine another account made /var/tmp/tco-dev-cluster first and
    `install -d` made the hosts' TMPDIR directories inside it; the account could then swap them."""
    import shutil
    import uuid

    base = Path("/var/tmp") / f"tco-test-{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(["runuser", "-u", probe_account, "--", "mkdir", "-m", "0777", str(base)], check=True)
        out = _ensure_root_dirs(f"{base}/default/sge-exec1")
        assert out.returncode == 1 and f"{base} is not a directory of root's" in out.stderr, out
        assert not (base / "default").exists()
        shutil.rmtree(base)
        fresh = _ensure_root_dirs(f"{base}/default/sge-exec1")
        assert fresh.returncode == 0, fresh
        for d in (base, base / "default", base / "default" / "sge-exec1"):
            st = d.stat()
            assert (st.st_uid, oct(st.st_mode & 0o777)) == (0, "0o755"), d
    finally:
        shutil.rmtree(base, ignore_errors=True)
