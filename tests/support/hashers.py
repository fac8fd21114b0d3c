"""PBKDF2 at the speed of a dictionary lookup, for the database tests.

Django's PBKDF2 costs about 0.3 s a hash on this machine, and the database tests hash the same few
passwords thousands of times (``tco_bootstrap``'s admin in every test, each login, each wrong
password). This hasher is Django's ``PBKDF2PasswordHasher`` (same algorithm name, iterations and
encoded form: any PBKDF2 hasher, the live stack's among them, verifies what it writes) with one fixed
salt and its key derivation memoized: a (password, salt, iterations) computed once is looked up after.
Verification still compares the derived key, so a wrong password is still refused. What it cannot
tell apart: the same password set twice gives the same hash; the tests that check a stored hash is
unchanged run outside tests/unit and tests/db, with Django's own hasher.
"""
from __future__ import annotations

import functools

from django.contrib.auth.hashers import PBKDF2PasswordHasher

#: 28 letters and digits: about 166 bits, above Django's salt_entropy (128), so no login re-hashes.
SALT = "tcoTestSaltFixed0123456789ab"


@functools.lru_cache(maxsize=4096)
def _derived(password: str, salt: str, iterations: int) -> str:
    return PBKDF2PasswordHasher().encode(password, salt, iterations)


class MemoizedPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    def salt(self) -> str:
        return SALT

    def encode(self, password, salt, iterations=None):
        return _derived(password, salt, iterations or self.iterations)
