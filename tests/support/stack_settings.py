"""Settings for the live stack's web server and workers in the tests: the project's, with passwords
checked through tests/support/hashers.py (PBKDF2 as Django's, its derivations memoized and kept
between processes), as the test process hashes them: every sign-in of a browser test would
otherwise cost the web server a real PBKDF2 (0.3 s, 1 s on a loaded host)."""
from django.conf import global_settings

from tco_web.settings import *  # noqa: F401,F403

from tests.support.hashers import hashers_memoized

PASSWORD_HASHERS = hashers_memoized(global_settings.PASSWORD_HASHERS)  # tco_web.settings keeps Django's
