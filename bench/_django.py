"""Benchmarks' Django set-up: a fresh SQLite database in a temporary directory, migrated."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Settings that would otherwise point into the live instance's state directory
# (tco_web/settings.py derives them from TCO_STATE_DIR when unset).
_STATE_DERIVED = ("TCO_SPOOL_DIR", "TCO_INPUTS_ROOT")


def isolate_state(state_dir: Path) -> Path:
    """Give a benchmark a state directory of its own before Django starts (issue 16, bug 1).

    Sets ``TCO_STATE_DIR`` to ``state_dir`` (created, mode 0700) whatever the environment said,
    and drops the settings derived from it, so ``tco_bootstrap`` writes its ``admin-password``,
    ``secret_key`` and spool there and never in the live instance's ``var/``. Returns the
    directory. Call it before ``django.setup()``.
    """
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["TCO_STATE_DIR"] = str(state_dir)
    for name in _STATE_DERIVED:
        os.environ.pop(name, None)
    return state_dir


def setup_temp_django(prefix: str) -> Path:
    """Point Django at a new SQLite file under a new temp dir, migrate it, return the dir."""
    sys.path.insert(0, str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
    isolate_state(tmp)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tco_web.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return tmp
