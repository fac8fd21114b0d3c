"""A landing-page scene: research's and engineering's campaigns in every state the tiles count, a
cluster poll with slots, seats and a host down, and a day budget research has spent past."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Budget, Task, Team
from tests.support.history import make_campaign, make_task

#: The cluster poll: agent.q 8 slots (5 used), classic.q 4 (1 used); 96 seats, 90 free; hosts
#: sge-exec1 and sge-exec2 up, sge-exec3 without a load report (unreachable).
STATUS = {
    "queues": [{"name": "agent.q", "total": 8, "used": 5, "resv": 0, "available": 3},
               {"name": "classic.q", "total": 4, "used": 1, "resv": 0, "available": 3}],
    "queue_instances": [],
    "hosts": [{"name": "global", "resources": {"anthropic_api": {"value": "90.000000", "dominance": "gc"}}},
              {"name": "sge-exec1", "load_avg": 0.5, "num_proc": 2},
              {"name": "sge-exec2", "load_avg": 0.7, "num_proc": 2},
              {"name": "sge-exec3", "load_avg": None, "num_proc": 2}],
    "global_capacity": {"anthropic_api": 96},
    "quotas": [],
}


def landing_scene(users: dict, *, now: dt.datetime | None = None) -> dict:
    """Campaigns and tasks (``users``: ``ops_users``/``ops_logins``): research's "land-mine" by the
    launcher (2 running at $0.30, 1 pending for 20 min, 1 held, 1 failed and 1 done in the last
    hour at $0.25 each), research's "land-lead" by the lead (2 done 3 h ago), engineering's
    "land-eng" by ``other`` (3 running). Research has a day budget of $1.00. Returns the campaigns
    by name."""
    now = now or timezone.now()
    cluster = cluster_get_default()
    cluster.status = STATUS
    cluster.save(update_fields=["status"])
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    mine = make_campaign(team=research, user=users["launcher"], name="land-mine", status="running", count=6)
    lead = make_campaign(team=research, user=users["lead"], name="land-lead", status="finished", count=2)
    eng = make_campaign(team=engineering, user=users["other"], name="land-eng", status="running", count=3)
    started = now - dt.timedelta(minutes=50)
    for n, host in ((1, "sge-exec1"), (2, "sge-exec2")):
        task = make_task(mine, task_number=n, started_at=started, state="running", cost_usd="0.30")
        Task.objects.filter(pk=task.pk).update(host=host, ended_at=None, wallclock_s=None)
    for n, state in ((3, "pending"), (4, "held")):
        task = make_task(mine, task_number=n, started_at=None, state=state)
        Task.objects.filter(pk=task.pk).update(submitted_at=now - dt.timedelta(minutes=20 if n == 3 else 5))
    make_task(mine, task_number=5, started_at=started, wallclock_s=1800, state="failed", cost_usd="0.25")
    make_task(mine, task_number=6, started_at=started, wallclock_s=2400, state="done", cost_usd="0.25")
    for n in (1, 2):
        make_task(lead, task_number=n, started_at=now - dt.timedelta(hours=3, minutes=5), wallclock_s=60,
                  cost_usd="0.10")
    for n in (1, 2, 3):
        task = make_task(eng, task_number=n, started_at=started, state="running")
        Task.objects.filter(pk=task.pk).update(host="sge-exec1", ended_at=None, wallclock_s=None)
    Budget.objects.update_or_create(team=research, period="day",
                                    defaults={"amount_usd": Decimal("1.00"), "thresholds": [0.5, 0.8]})
    return {"land-mine": mine, "land-lead": lead, "land-eng": eng}
