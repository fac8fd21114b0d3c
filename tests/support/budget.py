"""How many random cases a property test tries: all of them in ``make test``, a fixed first part in ``make check``.

scripts/check sets ``TCO_TEST_BUDGET=check`` so the loop stays under a minute (docs/testing and README,
Developing); scripts/test leaves it unset and every case runs there, as in CI. The part is the same on
each run (the first seeds), so a failure in ``make check`` is reproducible; the rest run in ``make test``.
"""
from __future__ import annotations

import os


def is_check() -> bool:
    """True under ``make check`` (``TCO_TEST_BUDGET=check``)."""
    return os.environ.get("TCO_TEST_BUDGET") == "check"


def cases(full: int, check: int) -> int:
    """The number of random cases to try: ``full`` normally, ``check`` (smaller) under ``make check``."""
    return min(full, check) if is_check() else full


def seeds(full: list, check: int) -> list:
    """The first ``check`` of ``full`` under ``make check``, else all of ``full`` (for ``parametrize``)."""
    return full[:check] if is_check() else list(full)
