"""Where things are: the repository and the captured scheduler output (no Django needed)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
