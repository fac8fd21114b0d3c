"""Prometheus' own checker (promtool, Debian's prometheus package) for the metrics and rules tests."""
from __future__ import annotations

import os
import shutil

import pytest


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/setup installs Debian's prometheus package")
        pytest.skip("promtool is missing (scripts/setup installs Debian's prometheus package)")
    return found
