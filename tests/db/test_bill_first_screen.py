"""The bill opens on its answer (issue 24, round 4): spend, then the budgets it counts against, above
the presets, the form and the counting rules (a phone shows them first without a swipe); other
accounts' jobs under a team's project are an admin's rows, a lead sees only their sum, said as not theirs."""
from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.models import Budget, Team
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db


def _scene(ops_users):
    research = Team.objects.get(project="research")
    now = timezone.now()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0) + dt.timedelta(minutes=1)
    start = min(now - dt.timedelta(seconds=30), today)
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="billed")
    make_task(campaign, task_number=1, started_at=start, wallclock_s=10, cost_usd="0.30")
    make_task(campaign, task_number=2, started_at=start, wallclock_s=10, cost_usd="0.45")
    # Another account's qsub -P research, 2 tasks (accounting records), the same day.
    for n in (1, 2):
        make_task(None, task_number=n, job_number=88001, started_at=start, wallclock_s=50, project="research")
    Budget.objects.create(team=research, period="day", amount_usd=Decimal("3.00"), thresholds=[0.5])
    return start.date()


def _bill(client, day) -> str:
    return client.get("/ops/bills/", {"period": "day", "first": day.isoformat(), "last": day.isoformat(),
                                      "group_by": "team", "team": ""}).content.decode()


def test_spend_and_its_budget_come_before_the_form_and_the_rules(as_user, ops_users):
    day = _scene(ops_users)
    html = _bill(as_user("lead"), day)
    order = [html.index(marker) for marker in ('id="kpi-cost"', 'id="bill-presets"', 'id="bill-form"',
                                               'id="bill-definitions"', 'id="usage-definition"')]
    assert order == sorted(order)
    cost = html.split('id="kpi-cost"', 1)[1].split("</div>", 1)[0]
    # $0.30 + $0.45 of the $3.00 daily budget: 25 %, computed here.
    spent = Decimal("0.30") + Decimal("0.45")
    assert f"({spent / Decimal('3.00'):.0%})" in cost
    assert re.search(r"research: \$0\.750* of its \$3\.00 daily budget", cost)


def test_a_lead_sees_other_accounts_jobs_only_as_their_sum_said_as_not_theirs(as_user, ops_users):
    day = _scene(ops_users)
    lead = _bill(as_user("lead"), day)
    body = lead.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in lead else ""
    assert 'data-tco="0"' not in body and "(not launched by tco)" not in body
    assert 'id="kpi-not-tco"' not in lead
    footer = lead.split('id="bill-not-tco"', 1)[1].split("</tr>", 1)[0]
    assert "not your team's campaigns" in footer and 'data-col="tasks">2<' in footer
    admin = _bill(as_user("admin"), day)
    assert 'data-tco="0"' in admin and 'id="kpi-not-tco"' in admin
    assert "2 tasks" in admin.split('id="kpi-not-tco"', 1)[1].split("</div>", 1)[0]
