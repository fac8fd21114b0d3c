"""Issue 23 (done means): the site layout in deploy/ keeps the spool, where agents write, apart from
the database and tco's state, so a full spool cannot stop PostgreSQL, the logs or the pages."""
from __future__ import annotations

from pathlib import PurePosixPath

from tests.support.paths import REPO

DEPLOY = REPO / "deploy"


def _env() -> dict[str, str]:
    out = {}
    for line in (DEPLOY / "tco.env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value.strip("'\"")
    return out


def _inside(path: str, root: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(root) or PurePosixPath(root) in PurePosixPath(path).parents


def test_the_example_puts_the_spool_on_another_tree_than_the_state_and_the_database():
    env = _env()
    spool, state = env["TCO_SPOOL_DIR"], env["TCO_STATE_DIR"]
    assert spool.startswith("/") and state.startswith("/")
    assert not _inside(spool, state) and not _inside(state, spool)
    for database_tree in ("/var/lib/postgresql", "/var/lib/tco", "/etc/tco"):
        assert not _inside(spool, database_tree), (spool, database_tree)
    # The database is PostgreSQL through its URL file, never a SQLite file beside the spool.
    assert "DATABASE_URL_FILE" in env and "DATABASE_URL" not in env


def test_the_docs_say_so():
    assert "Keep the spool and the database apart" in (REPO / "docs" / "deployment.md").read_text()
    assert "## Keep the spool and the database on separate file systems" in (REPO / "docs" / "limits.md").read_text()
