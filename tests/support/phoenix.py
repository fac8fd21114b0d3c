"""Arize Phoenix as the tests' OTLP receiver: started on a given address, spans read back through its REST API.

Phoenix comes from its own virtual environment (``.venv-phoenix``, scripts/setup, pinned in
tests/phoenix-requirements.txt); it is not a dependency of tco. It keeps its database in the working
directory given (SQLite), sends no telemetry of its own (``PHOENIX_TELEMETRY_ENABLED=false``) and
listens only where told. Its REST API (``GET /v1/projects/<project>/spans``) gives each span's name,
``context`` (trace and span id, hex), ``parent_id``, times, ``span_kind`` (OpenInference's kind, which
Phoenix derives from the attributes: ``LLM``, ``AGENT``, ``UNKNOWN``; it does not keep OpenTelemetry's
CLIENT/INTERNAL kind) and ``attributes``.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
PHOENIX = REPO / ".venv-phoenix" / "bin" / "phoenix"


def free_port(host: str) -> int:
    """A free TCP port on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def phoenix_server(host: str, workdir: Path, *, start_timeout_s: float = 180.0) -> Iterator[str]:
    """Run ``phoenix serve`` on ``host`` (HTTP and OTLP/HTTP on one free port, OTLP/gRPC on another),
    its data in ``workdir``; yields its base URL (``http://host:port``) once ``/healthz`` answers 200.
    Raises RuntimeError (with its log's tail) if it does not within ``start_timeout_s`` seconds, or
    FileNotFoundError when scripts/setup has not made ``.venv-phoenix``."""
    if not PHOENIX.exists():
        raise FileNotFoundError(f"{PHOENIX} is missing: scripts/setup installs Arize Phoenix there")
    port, grpc_port = free_port(host), free_port(host)
    workdir.mkdir(parents=True, exist_ok=True)
    log = open(workdir / "phoenix.log", "wb")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), "LANG": "C.UTF-8",
           "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_HOST": host, "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_TELEMETRY_ENABLED": "false"}
    proc = subprocess.Popen([str(PHOENIX), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "phoenix.log").read_bytes()[-3000:].decode(errors="replace")
                raise RuntimeError(f"Phoenix did not start on {url} (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def spans(url: str, project: str = "default", limit: int = 1000) -> list[dict]:
    """Every span of ``project`` (Phoenix's REST shape, module doc), following ``next_cursor``."""
    found: list[dict] = []
    cursor = None
    while True:
        query = f"limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        with urllib.request.urlopen(f"{url}/v1/projects/{project}/spans?{query}", timeout=30) as resp:
            page = json.loads(resp.read())
        found += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return found


def wait_for_spans(url: str, trace_id: str, count: int, timeout_s: float = 60.0) -> list[dict]:
    """The spans of trace ``trace_id`` (32 hex) once there are at least ``count`` of them (Phoenix
    writes what it received in batches). Raises AssertionError with what arrived after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = [s for s in spans(url) if s["context"]["trace_id"] == trace_id]
        if len(got) >= count:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {count} spans of trace {trace_id} reached Phoenix: "
                                 f"{sorted(s['name'] for s in got)}")
        time.sleep(0.5)
