"""Benchmarks' Django set-up: a fresh SQLite database in a temporary directory, migrated."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def setup_temp_django(prefix: str) -> Path:
    """Point Django at a new SQLite file under a new temp dir, migrate it, return the dir."""
    sys.path.insert(0, str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
    os.environ.setdefault("TCO_STATE_DIR", str(tmp))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tco_web.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return tmp
