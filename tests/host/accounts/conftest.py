"""Host tests as other local accounts: attacks by another local account on a set-up machine (issue 11).

They act as a second, unprivileged account (``nobody``, and ``tco-probe``
made by scripts/dev-cluster), so they run as root: scripts/test runs them
before the rest of the suite, which runs as tco. They need scripts/setup to
have run (the state directory, Redis with its password, the dev cluster).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    # The hook sees every collected test, not only this folder's: skip only ours.
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="these host tests act as other local accounts: run them as root (scripts/test does)")
        for item in items:
            if HERE in Path(item.path).resolve().parents:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def probe_account() -> str:
    """``tco-probe``: an ordinary local account (uid >= 1000, no shell), as scripts/dev-cluster --verify makes it."""
    if subprocess.run(["id", "tco-probe"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                        "--comment", "tco dev-cluster probe (never submits)", "tco-probe"], check=True)
    return "tco-probe"
