"""The runner's proxy start (execution/runner/proxy_start.py): a proxy that never listened leaves no
``requests_path`` in the record (ingest quarantines a record whose requests file is missing, and with it
the task's stages and exit status), and a start still under way when the runner gives up never listens."""
from __future__ import annotations

import threading

from execution.metering import prices, proxy_spec, proxy_thread
from execution.metering.endpoints import Limits
from execution.runner import proxy_start


def plan(tmp_path) -> proxy_start.ProxyPlan:
    return proxy_start.ProxyPlan(policy={}, upstreams={}, registered=(), credentials_file=str(tmp_path / "c.json"),
                                 prices_file=str(tmp_path / "prices.json"), token_cap=None, cost_cap=None,
                                 limits=Limits())


class Handle:
    def __init__(self, path):
        open(path, "a").close()      # the real sink creates its file before the proxy listens

    def stop(self, timeout):
        return {"requests": 0}


def test_a_proxy_still_starting_when_the_runner_gives_up_leaves_no_requests_path_and_never_listens(
        tmp_path, monkeypatch):
    release = threading.Event()
    started = []

    def slow_prices(path):          # the import and reads before the start, on a host at load 112
        release.wait(10)
        return None

    monkeypatch.setattr(proxy_start, "PROXY_STOP_S", 0.2)
    monkeypatch.setattr(prices.PriceTable, "from_file", staticmethod(slow_prices))
    monkeypatch.setattr(proxy_spec, "ProxySpec", lambda *a, **k: object())
    monkeypatch.setattr(proxy_thread, "start_proxy", lambda path, spec, **k: started.append(path) or Handle(
        k["record_path"]))
    requests = str(tmp_path / "7.requests.jsonl")
    starter = proxy_start.ProxyStarter(plan(tmp_path), socket_path=str(tmp_path / "proxy.sock"),
                                       requests_path=requests)
    starter.start_soon()
    assert starter.stop() is None
    assert starter.error == "metering proxy did not start in time"
    assert starter.started and starter.requests_file is None
    release.set()
    starter.thread.join(5)
    assert not starter.thread.is_alive()
    assert started == [] and not (tmp_path / "7.requests.jsonl").exists()   # it never listened


def test_a_proxy_that_listened_names_its_requests_file_even_without_a_request(tmp_path, monkeypatch):
    monkeypatch.setattr(prices.PriceTable, "from_file", staticmethod(lambda path: None))
    monkeypatch.setattr(proxy_spec, "ProxySpec", lambda *a, **k: object())
    monkeypatch.setattr(proxy_thread, "start_proxy", lambda path, spec, **k: Handle(k["record_path"]))
    requests = str(tmp_path / "8.requests.jsonl")
    starter = proxy_start.ProxyStarter(plan(tmp_path), socket_path=str(tmp_path / "proxy.sock"),
                                       requests_path=requests)
    starter.start_soon()
    starter.thread.join(5)
    assert starter.requests_file == requests
    assert starter.stop() == {"requests": 0} and starter.error is None
