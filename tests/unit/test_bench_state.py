"""Issue 16, bug 1: running a benchmark never touches the live instance's state directory.

Each benchmark's Django set-up runs in a fresh interpreter with ``TCO_STATE_DIR`` pointing at a
stand-in for the live instance (holding its ``admin-password``), then bootstraps as the benchmark
does. The live password file must be byte-for-byte what it was, and nothing new may appear there.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import {module} as bench
bench.setup_django(Path({db!r}))
from django.conf import settings
from django.core.management import call_command
# The tables straight from the models (what pytest-django's --nomigrations does): the migrations'
# steps are not what this test is about, and replaying all of them costs seconds per benchmark.
class NoMigrations(dict):
    def __contains__(self, app):
        return True
    def __getitem__(self, app):
        return None
settings.MIGRATION_MODULES = NoMigrations()
call_command("migrate", run_syncdb=True, verbosity=0)
call_command("tco_bootstrap", stdout=open(os.devnull, "w"))
print(settings.STATE_DIR)
"""


@pytest.mark.parametrize("module", ["bench_pages", "bench_ws_latency"])
def test_benchmark_keeps_off_the_live_state_dir(tmp_path, module):
    live = tmp_path / "live-var"
    live.mkdir()
    (live / "admin-password").write_text("the-live-password\n")
    before = sorted(p.name for p in live.iterdir())
    db = tmp_path / "bench" / "bench.sqlite3"
    db.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(TCO_STATE_DIR=str(live), TCO_SPOOL_DIR=str(live / "spool"), TCO_INPUTS_ROOT=str(live / "inputs"),
               SECRET_KEY="bench-test-secret", PYTHONDONTWRITEBYTECODE="1")
    env.pop("DATABASE_URL", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(bench=str(REPO / "bench"), module=module, db=str(db))],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    used = Path(out.stdout.strip().splitlines()[-1])
    assert used == Path(str(db) + ".state").resolve()
    assert (live / "admin-password").read_text() == "the-live-password\n"
    assert sorted(p.name for p in live.iterdir()) == before
    assert (used / "admin-password").exists()
