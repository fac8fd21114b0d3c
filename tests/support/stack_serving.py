"""A live stack (tests/support/stack.py's :class:`Stack`) served for a test scope: the fixtures of
tests/conftest.py (one stack per module) and tests/browser/conftest.py (one for the browser package)
start theirs through :func:`serving_stack`."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.stack import TEST_OUTPUT, Stack

#: The live stack's settings: the project's, with the tests' password hasher.
STACK_SETTINGS = "tests.support.stack_settings"
#: The same with e-mail written to files under ``MAIL_DIR`` instead of sent.
MAIL_SETTINGS = "tests.support.mail_settings"
MAIL_DIR = TEST_OUTPUT / "mail"


@contextmanager
def serving_stack(name: str, tmp_path_factory, settings_module: str = STACK_SETTINGS,
                  worker_name: str = "test") -> Iterator[Stack]:
    """A stack on the test database, started (web server answering: RuntimeError after 30 s) and
    stopped when the block ends, however it ends.

    ``name`` names its logs (``var/test-output/<name>-logs``, emptied first) and its directory under
    pytest's temporary root (its spool, ``stack.spool``, and beat's schedule); ``settings_module``
    is the processes' ``DJANGO_SETTINGS_MODULE``. With :data:`MAIL_SETTINGS`, ``stack.mail_dir`` is
    the directory the mail goes to (made here). Needs pytest-django's ``django_db_setup`` done: the
    stack opens the test database by its name.
    """
    from django.db import connection

    log_dir = TEST_OUTPUT / f"{name}-logs"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    root = tmp_path_factory.mktemp(name)
    stack = Stack(connection.settings_dict["NAME"], root / "spool", log_dir)
    stack.spool = root / "spool"
    stack.env["DJANGO_SETTINGS_MODULE"] = settings_module
    if settings_module == MAIL_SETTINGS:
        stack.mail_dir = MAIL_DIR
        stack.mail_dir.mkdir(parents=True, exist_ok=True)
    with stack.serving(root / "beat-schedule", worker_name):
        yield stack
