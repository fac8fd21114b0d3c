"""Commands run as another local account (runuser), as the host tests do."""
from __future__ import annotations

import os
import subprocess


def as_user(user: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` as ``user`` (runuser), from /, with a minimal environment; never raises on failure."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SGE_ROOT": os.environ.get("SGE_ROOT", "/var/lib/gridengine"),
           "SGE_CELL": os.environ.get("SGE_CELL", "default"), "HOME": "/"}
    return subprocess.run(["runuser", "-u", user, "--", *argv], cwd="/", env=env, capture_output=True, text=True,
                          timeout=60, **kwargs)
