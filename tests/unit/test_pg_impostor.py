"""Fresh attack (2026-12-03): a local account that binds PostgreSQL's port while the server is down asks
tco for a clear-text password, and libpq sent it. ``tco_web.settings.postgres_options`` adds
``require_auth=!password`` (libpq 16+; psycopg-binary bundles a newer libpq): the password never leaves.

The impostor here speaks the protocol's first messages (PostgreSQL docs, "Message Flow", "Message
Formats": SSLRequest/GSSENCRequest answered ``N``, then AuthenticationCleartextPassword ``R``/3) on a
loopback port of its own and records what the client sends back.
"""
from __future__ import annotations

import socket
import struct
import threading

import psycopg
import pytest

from tco_web.settings import postgres_options

SECRET = "tco-db-secret-4f2a"
NEGOTIATIONS = {80877103, 80877104}  # SSLRequest, GSSENCRequest


class Impostor:
    """Listens on 127.0.0.1 (a free port), asks the first client for a clear-text password, keeps what
    it then sends (``received``, bytes)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read(self, conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(10)
        with conn:
            while True:
                head = self._read(conn, 8)
                if len(head) < 8:
                    return
                length, code = struct.unpack("!ii", head)
                if code in NEGOTIATIONS:
                    conn.sendall(b"N")
                    continue
                self._read(conn, length - 8)  # the startup message's parameters
                break
            conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
            try:  # the client's answer (a PasswordMessage 'p'), or its close
                self.received = conn.recv(4096)
            except OSError:
                pass

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.sock.close()


def connect(port: int, options: dict) -> None:
    psycopg.connect(host="127.0.0.1", port=port, user="tco", password=SECRET, dbname="tco", connect_timeout=5,
                    **options).close()


def test_without_the_option_libpq_sends_the_password_in_clear_to_the_impostor():
    """The attack as found (the options tco set before: JIT off only)."""
    impostor = Impostor()
    with pytest.raises(psycopg.OperationalError):
        connect(impostor.port, {"options": "-c jit=off"})
    impostor.close()
    assert SECRET.encode() in impostor.received


def test_tcos_options_never_send_the_password_to_the_impostor(monkeypatch):
    monkeypatch.delenv("TCO_PG_REQUIRE_AUTH", raising=False)
    options = postgres_options({})
    assert options == {"options": "-c jit=off", "require_auth": "!password"}
    impostor = Impostor()
    with pytest.raises(psycopg.OperationalError, match="password"):
        connect(impostor.port, options)
    impostor.close()
    assert SECRET.encode() not in impostor.received


def test_a_sites_own_options_are_kept():
    assert postgres_options({"options": "-c jit=on", "require_auth": "scram-sha-256", "sslmode": "require"}) == {
        "options": "-c jit=on", "require_auth": "scram-sha-256", "sslmode": "require"}
