"""The seed replay's watchers (issue 15 items 4 and 5) on the real dev cluster and web server.

Runs run 1 of the replay (10 demo agents of two teams, work scaled to about a
second, an urgent agent) against the live stack (web server, Celery worker, beat)
while the admin (every page of every campaign) and 4 WebSocket clients of two
teams (two each of research and engineering) watch, as browsers do, the queue
page and page 1 of one campaign of their team (the first launched: the urgent
agent's campaign is research's second). The expected changes of each client
are computed here, from the database after the run: every task of the pages
it has open started and ended; it must have received exactly those (no task
of another team) and been refused (4403) on the other team's campaign. No
timing is asserted.
"""
from __future__ import annotations

import pytest

from dashboards.models import Campaign, Task
from demo.replay.main import replay
from demo.replay.options import ReplayOptions
from demo.watch.lags import GONE, STARTED

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_every_watcher_gets_every_change_of_its_team_and_none_of_the_other(live_stack, tmp_path):
    pids = {name: proc.pid for name, proc in live_stack.procs}
    result = replay(opts=ReplayOptions(agents=10, sweep=0, work_scale=0.05, submit_here=True, timeout_s=600,
                                       watchers=4, web_url=live_stack.url, pids=pids, out_dir=tmp_path / "report"),
                    log=lambda line: None)
    live = result["teams"]["live"]
    campaigns = {c.pk: c for c in Campaign.objects.filter(
        name__in=["replay-research", "replay-engineering", "replay-urgent"])}
    assert len(campaigns) == 3
    # the campaign each watcher has open (5 tasks: all on page 1)
    jobs_of = {c.team.project: {c.job_number} for c in campaigns.values() if c.name != "replay-urgent"}
    every = {(t.job_number, t.task_number) for t in Task.objects.filter(campaign__in=campaigns.values())}
    assert len(every) == 11

    clients = {c["user"]: c for c in live["clients"]}
    assert sorted(clients) == ["admin", "replay-watch-engineering-01", "replay-watch-engineering-02",
                               "replay-watch-research-01", "replay-watch-research-02"]
    for name, client in clients.items():
        project = None if name == "admin" else name.split("-")[2]
        mine = every if project is None else {k for k in every if k[0] in jobs_of[project]}
        expected = {(job, task, kind) for job, task in mine for kind in (STARTED, GONE)}
        arrived = {tuple(k) for k in client["arrived"]}
        assert arrived == expected, (name, sorted(expected - arrived), sorted(arrived - expected))
        assert client["lag"]["missed"] == [] and client["violations"] == [], (name, client)
        assert client["errors"] == [], (name, client["errors"])
        if project is not None:
            assert client["probes"] == {c.pk: 4403 for c in campaigns.values() if c.team.project != project}
    # The report prints the section, with what the clients missed and saw too much counted here.
    assert "Live lag (item 4)" in result["report"] and "Load (item 5): 4 WebSocket clients" in result["report"]
    assert "missed 0 (clients missing any: 0)" in result["report"]
    assert "scoping: 0 client(s) received what they may not see" in result["report"]
    assert set(live["rss"]) == set(pids) and all(v["peak"] > 0 for v in live["rss"].values())
