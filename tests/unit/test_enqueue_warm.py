"""enqueue.warm: the first send of a process is made as quick as the next; a broker that is down at
start is logged, never raised (the send itself reports it where the caller decides)."""
from __future__ import annotations

import socket

from celery import Celery

from dashboards.core import enqueue


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_warm_opens_the_producer_connection_and_keeps_it_in_the_pool(monkeypatch):
    app = Celery("t", broker="memory://", backend="cache+memory://")
    monkeypatch.setattr(enqueue, "current_app", app)
    assert enqueue.warm() is True
    with app.producer_or_acquire() as producer:   # the pool hands back the connection warm() opened
        assert producer.connection.connected


def test_warm_with_the_broker_down_says_so_and_does_not_raise(monkeypatch, caplog):
    port = free_port()   # nothing listens there
    app = Celery("t", broker=f"redis://127.0.0.1:{port}/0", backend="cache+memory://")
    app.conf.broker_connection_timeout = 0.5
    monkeypatch.setattr(enqueue, "current_app", app)
    # kombu waits 2 s (its interval_start) before the one retry warm() allows: not slept here (the
    # retry itself still runs, refused as the first try).
    monkeypatch.setattr("kombu.utils.functional.sleep", lambda seconds: None)
    assert enqueue.warm() is False
    assert "broker not reached while warming the producer" in caplog.text
