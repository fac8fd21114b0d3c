"""Fixtures of the sandbox tests: the runner's spool of one campaign."""
from __future__ import annotations

import pytest

from tests.support.runner import Spool


@pytest.fixture
def spool(tmp_path) -> Spool:
    return Spool(tmp_path / "spool")
