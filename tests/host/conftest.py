"""Host tests: attacks by another local account on a set-up machine (issue 11).

They act as a second, unprivileged account (``nobody``, and ``tco-probe``
made by scripts/dev-cluster), so they run as root: scripts/test runs them
before the rest of the suite, which runs as tco. They need scripts/setup to
have run (the state directory, Redis with its password, the dev cluster).
"""
from __future__ import annotations

import os
import subprocess

import pytest


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        fail = pytest.mark.skip(reason="host tests act as other local accounts: run them as root (scripts/test does)")
        for item in items:
            item.add_marker(fail)


def as_user(user: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` as ``user`` (runuser), from /, with a minimal environment; never raises on failure."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SGE_ROOT": os.environ.get("SGE_ROOT", "/var/lib/gridengine"),
           "SGE_CELL": os.environ.get("SGE_CELL", "default"), "HOME": "/"}
    return subprocess.run(["runuser", "-u", user, "--", *argv], cwd="/", env=env, capture_output=True, text=True,
                          timeout=60, **kwargs)


@pytest.fixture(scope="session")
def probe_account() -> str:
    """``tco-probe``: an ordinary local account (uid >= 1000, no shell), as scripts/dev-cluster --verify makes it."""
    if subprocess.run(["id", "tco-probe"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                        "--comment", "tco dev-cluster probe (never submits)", "tco-probe"], check=True)
    return "tco-probe"
