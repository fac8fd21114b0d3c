"""Finding F4: the demo's stand-in model listened on the unprivileged port 8793 of the bridge
address; after `make stop` any local account could bind it and receive the agents' requests
(with the credential the proxy adds), impersonating the registered endpoint.

The stand-in's port is privileged now (below net.ipv4.ip_unprivileged_port_start): only root
binds it (scripts/listen-as, run by scripts/demo) and hands the socket to the stand-in, which
runs as tco. The attack below is another account binding that address and port.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from tests.support.accounts import as_user

REPO = Path(__file__).resolve().parents[3]
BIND = "import socket, sys; s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print('bound')"


def unprivileged_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())


def test_another_account_cannot_listen_where_the_agents_reach_the_stand_in(probe_account):
    from dashboards.management.commands.tco_bootstrap import demo_model_host

    host, port = demo_model_host(), settings.TCO_DEMO_MODEL_PORT
    attack = as_user(probe_account, ["/usr/bin/python3", "-c", BIND, host, str(port)])
    assert attack.returncode != 0 and "bound" not in attack.stdout, attack
    assert "Permission denied" in attack.stderr, attack  # refused for the port, not because it is taken
    assert port < unprivileged_start()


def free_privileged_port(host: str) -> int:
    for port in range(700, 1000):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError("no free privileged port")


def test_root_binds_the_port_and_the_stand_in_gets_it_as_tco():
    """scripts/listen-as (what scripts/demo runs): the socket reaches a process of tco's."""
    port = free_privileged_port("127.0.0.1")
    show = "import os, socket; s = socket.socket(fileno=3); print(os.getuid(), s.getsockname()[1])"
    out = subprocess.run([sys.executable, str(REPO / "scripts/listen-as"), "--user", "tco", "--address", "127.0.0.1",
                          "--port", str(port), "--fd", "3", "--", "/usr/bin/python3", "-c", show],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out
    uid = int(subprocess.check_output(["id", "-u", "tco"]))
    assert out.stdout.split() == [str(uid), str(port)]
