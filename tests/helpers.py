"""Plain helpers shared by tests and benchmarks (no Django: bench/ and scheduler tests import them)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, step: float = 0.3) -> T:
    """Call ``predicate`` every ``step`` seconds until it returns something true, and return that.

    Raises AssertionError naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def model_api_policy(model_port: int, binary: str, read_only_extra: Iterable[str] = (), host: str = "127.0.0.1") -> str:
    """A sandbox policy (YAML, the OpenShell policy format execution/sandbox/policy/ reads) that lets
    ``binary`` make only ``POST /v1/messages`` to the stand-in model on ``host:model_port``,
    with the anthropic credential bound; the system directories (plus ``read_only_extra``) are
    read-only, ``/sandbox`` and ``/tmp`` writable, and the agent runs as ``sandbox``."""
    read_only = ", ".join(["/usr", "/lib", "/lib64", "/bin", "/etc", *map(str, read_only_extra)])
    return f"""version: 1
filesystem_policy:
  include_workdir: true
  read_only: [{read_only}]
  read_write: [/sandbox, /tmp]
process: {{run_as_user: sandbox, run_as_group: sandbox}}
network_policies:
  model_api:
    endpoints:
      - host: {host}
        port: {model_port}
        protocol: rest
        enforcement: enforce
        credential_binding: {{provider: anthropic}}
        rules: [{{allow: {{method: POST, path: /v1/messages}}}}]
    binaries: [{{path: {binary}}}]
"""
