"""``python -m assistant``: tco's read-only MCP server.

stdio (an assistant starts it as a subprocess)::

    TCO_API_TOKEN=<key> python -m assistant

streamable HTTP on loopback (each request sends ``Authorization: Bearer <key>``)::

    python -m assistant --http --port 8765      # http://127.0.0.1:8765/mcp

The token for stdio may also come from a file (``TCO_API_TOKEN_FILE``).
Exit status 2 for a bad command line or a missing or invalid token (the
reason on stderr).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _stdio_token() -> str | None:
    path = os.environ.get("TCO_API_TOKEN_FILE")
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            sys.exit(f"assistant: TCO_API_TOKEN_FILE={path!r} cannot be read: {exc}")
    return os.environ.get("TCO_API_TOKEN") or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assistant", description="tco's read-only MCP server")
    parser.add_argument("--http", action="store_true", help="streamable HTTP on loopback instead of stdio")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port for --http (default 8765)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error("--port must be 1 to 65535")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
    import django

    django.setup()
    from .server import build_server, http_app, is_loopback
    from .views import Refused, caller

    if args.http:
        if not is_loopback(args.host):
            parser.error(f"--host must be a loopback address (127.0.0.1, ::1, localhost), not {args.host!r}")
        import uvicorn

        app = http_app(build_server(), host=args.host, port=args.port)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        return 0

    key = _stdio_token()
    try:
        user = caller(key)
    except Refused as exc:
        print(f"assistant: refused: {exc}", file=sys.stderr)
        return 2
    from django.db import close_old_connections

    close_old_connections()
    print(f"assistant: serving tco read-only over stdio as {user.get_username()}", file=sys.stderr)
    build_server(stdio_key=key).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
