"""PBKDF2 at the speed of a dictionary lookup, for the database tests.

Django's PBKDF2 costs about 0.3 s a hash on this machine, and the database tests hash the same few
passwords thousands of times (``tco_bootstrap``'s admin in every test, each login, each wrong
password). This hasher is Django's ``PBKDF2PasswordHasher`` (same algorithm name, iterations and
encoded form: any PBKDF2 hasher, the live stack's among them, verifies what it writes) with one fixed
salt and its key derivation memoized: a (password, salt, iterations) computed once is looked up after.
Verification still compares the derived key, so a wrong password is still refused. What it cannot
tell apart: the same password set twice gives the same hash; the tests that check a stored hash is
unchanged run outside tests/unit and tests/db, with Django's own hasher.

The derivations are also kept between test processes (each worker of ``make check`` and the next run
would otherwise pay 0.3 s for each password it meets first): under ``STORE``, one file per (password,
salt, iterations), named by their SHA-256, holding the encoded hash. A file that is missing, unreadable
or not of that salt and iteration count is computed again (and written, when the directory can be).
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path

from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests.support.paths import REPO

#: 28 letters and digits: about 166 bits, above Django's salt_entropy (128), so no login re-hashes.
SALT = "tcoTestSaltFixed0123456789ab"
#: The derivations kept between processes: the state directory's (private to the submit account).
STORE = Path(os.environ.get("TCO_STATE_DIR") or REPO / "var") / "test-pbkdf2"


@functools.lru_cache(maxsize=4096)
def _derived(password: str, salt: str, iterations: int) -> str:
    path = STORE / hashlib.sha256(f"{iterations}\0{salt}\0{password}".encode()).hexdigest()
    try:
        kept = path.read_text()
    except OSError:
        kept = ""
    if kept.startswith(f"{PBKDF2PasswordHasher.algorithm}${iterations}${salt}$"):
        return kept
    encoded = PBKDF2PasswordHasher().encode(password, salt, iterations)
    if os.geteuid() == 0:
        return encoded  # root's tests (other local accounts, faults) leave the submit account's store alone
    try:
        STORE.mkdir(mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=STORE)
        with os.fdopen(fd, "w") as out:
            out.write(encoded)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only state directory: computed again next time
    return encoded


class MemoizedPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    def salt(self) -> str:
        return SALT

    def encode(self, password, salt, iterations=None):
        return _derived(password, salt, iterations or self.iterations)


def hashers_memoized(hashers: list[str]) -> list[str]:
    """``hashers`` (a ``PASSWORD_HASHERS``) with this module's hasher first and Django's own PBKDF2
    hasher left out (Django checks a password with the last hasher of its algorithm)."""
    return ["tests.support.hashers.MemoizedPBKDF2PasswordHasher",
            *(h for h in hashers if h != "django.contrib.auth.hashers.PBKDF2PasswordHasher")]
