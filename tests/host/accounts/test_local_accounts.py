"""Issue 11, findings 1, 3 and 7, replayed by another local account on the real host.

Finding 1: any local account wrote a pickle into tco's Redis (no password)
and /metrics ran it as tco. Finding 3: any local account copied the
world-readable database. Finding 7: any cluster account ran jobs under a
team's project (``qsub -P research``). Each test is that attack, which must
now fail.
"""
from __future__ import annotations

import os
import pickle
import stat
import subprocess
import uuid
from pathlib import Path

from django.conf import settings

from tests.support.accounts import as_user

INTRUDER = "nobody"
STATE = Path(settings.STATE_DIR)
PASSWORD_FILE = Path(os.environ.get("TCO_REDIS_PASSWORD_FILE", "/etc/tco/redis-password"))
REDIS_PORT = os.environ.get("TCO_REDIS_PORT", "6379")


class Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (subprocess.call, (["touch", self.path],))


def redis_as_tco():
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def test_another_account_cannot_write_a_pickle_into_redis(tmp_path):
    key = f"tco:1:campaign-usage:{uuid.uuid4().hex}"
    payload = pickle.dumps(Boom(str(tmp_path / "ran")))
    out = as_user(INTRUDER, ["redis-cli", "-h", "127.0.0.1", "-p", REDIS_PORT, "-x", "SET", key], input=payload.decode("latin-1"))
    assert "NOAUTH" in (out.stdout + out.stderr), out
    assert redis_as_tco().exists(key) == 0
    # Nor can it read the password.
    assert as_user(INTRUDER, ["cat", str(PASSWORD_FILE)]).returncode != 0
    mode = PASSWORD_FILE.stat()
    assert stat.S_IMODE(mode.st_mode) & 0o077 == 0 and mode.st_uid == int(subprocess.check_output(["id", "-u", "tco"]))


def test_redis_listens_on_loopback_only():
    out = subprocess.run(["ss", "-Hltn", f"sport = :{REDIS_PORT}"], capture_output=True, text=True, check=True).stdout
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}
    assert addresses == {"127.0.0.1"}, out


def test_a_pickle_in_the_real_cache_is_never_run(tmp_path):
    """Even one written with the password (by a compromised writer) reads as a miss in tco's processes."""
    from django.core.cache import cache

    marker = tmp_path / "ran"
    key = f"campaign-usage:{uuid.uuid4().hex}"
    client = redis_as_tco()
    client.set(cache.make_and_validate_key(key), pickle.dumps(Boom(str(marker))), ex=60)
    try:
        assert cache.get_many([key]) == {} or cache.get_many([key]) == {key: None}
        assert cache.get(key) is None
        assert not marker.exists()
    finally:
        client.delete(cache.make_and_validate_key(key))


def test_another_account_cannot_read_tco_state():
    assert stat.S_IMODE(STATE.stat().st_mode) == 0o700
    for name in ("tco.sqlite3", "secret_key", "admin-password", "metrics-token"):
        path = STATE / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
            assert as_user(INTRUDER, ["cat", str(path)]).returncode != 0, path
    for name in ("spool", "log", "run"):
        assert stat.S_IMODE((STATE / name).stat().st_mode) & 0o077 == 0, name
    assert as_user(INTRUDER, ["ls", str(STATE)]).returncode != 0
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        db = Path(database["NAME"])
        assert db.exists(), db
        copy = as_user(INTRUDER, ["head", "-c", "16", str(db)])
        assert copy.returncode != 0 and "SQLite" not in copy.stdout
    else:
        # PostgreSQL: the URL with the role's password is tco's alone, and without it the
        # intruder reaches no database (neither over TCP nor through the unix socket).
        url_file = Path(os.environ.get("DATABASE_URL_FILE") or "/etc/tco/database-url")
        assert url_file.exists() and stat.S_IMODE(url_file.stat().st_mode) & 0o007 == 0, url_file
        assert as_user(INTRUDER, ["cat", str(url_file)]).returncode != 0
        for host in ("127.0.0.1", "/var/run/postgresql"):
            probe = as_user(INTRUDER, ["env", "PGCONNECT_TIMEOUT=5", "psql", "-w", "-h", host, "-U",
                                       str(database["USER"]), "-d", str(database["NAME"]), "-c", "select 1"])
            assert probe.returncode != 0, probe


def qsub_research(user: str) -> subprocess.CompletedProcess:
    return as_user(user, ["qsub", "-terse", "-b", "y", "-P", "research", "-N", "acl-probe", "-o", "/dev/null",
                          "-j", "y", "-h", "/bin/true"])


def test_another_cluster_account_cannot_bill_a_team(probe_account):
    refused = qsub_research(probe_account)
    assert refused.returncode != 0 and refused.stdout.strip() == "", refused
    accepted = qsub_research("tco")  # held (-h), deleted at once: it never runs
    assert accepted.returncode == 0, accepted
    job = accepted.stdout.strip()
    assert job.isdigit()
    as_user("tco", ["qdel", job])
