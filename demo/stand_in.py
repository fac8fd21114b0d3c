"""Start the scripted stand-in model (demo/demo_model.py) on the registered demo endpoint's port.

``make demo`` starts it once, before it launches anything (``tco_demo_model``), so that every demo
campaign whose agents call a model finds it up: research's demo agents and engineering's review
agents both go through the metering proxy to it. Nothing here is needed by a site.
"""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from django.conf import settings

from dashboards.models import ModelEndpoint
from demo.sweep import write_demo_credential


class StandInError(Exception):
    """The stand-in cannot serve ``endpoint`` (not an http endpoint on this machine) or did not start."""


#: A demo stand-in key as :func:`demo_key` makes it.
DEMO_KEY = re.compile(r"sk-tco-demo-[0-9a-f]{24}")


def demo_key(key_file: Path) -> str:
    """The stand-in's API key: the one ``key_file`` holds when it is a demo key (a second ``make demo``
    restarts the stand-in while the first one's agents run: their metering proxies hold that key, and a new
    one answered them 401), else a fresh one (``sk-tco-demo-`` and 24 hex digits)."""
    try:
        kept = key_file.read_text().strip()
    except OSError:
        kept = ""
    return kept if DEMO_KEY.fullmatch(kept) else "sk-tco-demo-" + secrets.token_hex(12)


def stand_in_start(*, endpoint: ModelEndpoint, listen_fd: int | None = None,
                   warn=lambda message: None) -> tuple[str, int]:
    """Start the stand-in (script ``review``) for ``endpoint``: its key (:func:`demo_key`) in ``<state>/run/demo-model.key``
    (0600) and in the runners' credentials under the endpoint's credential name, the server detached
    in its own session, its pid in ``<state>/run/demo-model.pid`` (``scripts/services stop`` ends it),
    its log in ``<state>/log/demo-model.log``. ``listen_fd``: serve on this inherited listening socket
    (bound by root to the endpoint's privileged port, scripts/listen-as). ``warn(text)`` hears about
    an unprivileged port. Returns ``(base URL, pid)``. Raises StandInError."""
    from dashboards.management.commands.tco_bootstrap import demo_model_host
    from demo.demo_model import spawn

    # Where the runners on the execution hosts reach it (127.0.0.1 on a single-host cluster).
    host = demo_model_host()
    if endpoint.host not in ("127.0.0.1", "localhost", host) or endpoint.scheme != "http":
        raise StandInError(f"the stand-in needs an http endpoint on this machine ({host} or loopback); "
                           f"{endpoint} is not one")
    if endpoint.port >= 1024:
        # Any local account may bind an unprivileged port once the stand-in is gone (after
        # `make stop`) and receive the agents' requests with their credential (docs/security.md, F4).
        warn(f"warning: {endpoint} is on unprivileged port {endpoint.port}: after the stand-in stops, "
             "any local account can listen there; scripts/demo uses a privileged port")
    state = Path(settings.STATE_DIR)
    log_dir = state / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    key_file = state / "run" / "demo-model.key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key = demo_key(key_file)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    write_demo_credential(name=endpoint.credential_name, secret=key)
    try:
        proc = spawn(port=endpoint.port, api_key_file=str(key_file), script="review", cwd=str(settings.BASE_DIR),
                     stdout=open(log_dir / "demo-model.log", "ab"), new_session=True, host=host,
                     listen_fd=listen_fd)
    except RuntimeError as exc:
        raise StandInError(f"{exc}; see {log_dir / 'demo-model.log'}") from exc
    (state / "run" / "demo-model.pid").write_text(f"{proc.pid}\n")
    return f"http://{host}:{endpoint.port}", proc.pid
