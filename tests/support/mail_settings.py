"""Settings for the ops browser tests' web server and workers: the live stack's
(tests/support/stack_settings.py), with e-mail written to files under var/test-output/mail
(never sent)."""
from tests.support.stack_settings import *  # noqa: F401,F403
from tco_web.settings import STATE_DIR

EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = str(STATE_DIR / "test-output" / "mail")
