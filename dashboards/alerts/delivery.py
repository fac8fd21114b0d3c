"""Send an anomaly alert: e-mail to the team's leads and the admins, and a JSON POST to the site's webhook.

Each delivery is tried once, right after the alert is recorded, and its outcome is an audit entry
(``MAIL_ACTION``, ``WEBHOOK_ACTION``; ``deliveries`` reads them back). A failure is logged and
audited, never raised: the alert stays on the pages either way.

The webhook body is Alertmanager's (prometheus.io/docs/alerting/latest/configuration/,
"<webhook_config>": version 4, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL``, ``alerts`` of ``{status, labels, annotations, startsAt,
endsAt, generatorURL, fingerprint}``), so any receiver written for Alertmanager reads it; with
``TCO_ALERT_WEBHOOK_FORMAT=alertmanager`` it is instead the list Alertmanager's own
``POST /api/v2/alerts`` takes (``[{labels, annotations, startsAt, generatorURL}]``), so a site
can send tco's alerts into its Alertmanager and route them with the rest.
"""
from __future__ import annotations

import hashlib
import json
import logging
import urllib.error
import urllib.request
from typing import Any, Sequence

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.urls import NoReverseMatch, reverse

from dashboards.billing.budgets import mail_error
from dashboards.core.audit import audit
from dashboards.models import AnomalyAlert, Membership, Team
from dashboards.team_models import Role

log = logging.getLogger(__name__)

MAIL_ACTION = "anomaly_alert_mail"
WEBHOOK_ACTION = "anomaly_alert_webhook"
#: Alertmanager's "no end time" (Go's zero time), what it sends for a firing alert.
NO_END = "0001-01-01T00:00:00Z"
ALERT_NAMES = {"task_pending": "TcoTasksPendingLong", "task_running": "TcoTasksRunningLong",
               "campaign_failures": "TcoCampaignFailureBurst", "budget_burn": "TcoBudgetExhaustedEarly"}


def alert_link(alert: AnomalyAlert, *, absolute: bool = True) -> str:
    """Where the alert is looked into: the campaign's page, or the budgets page; with ``absolute``
    prefixed with ``TCO_SITE_URL`` when set (e-mails and webhooks leave tco), else a path."""
    try:
        if alert.campaign_id is not None:
            path = reverse("campaign", args=[alert.campaign_id])
        else:
            path = reverse("ops-budgets")
    except NoReverseMatch:
        path = "/"
    return (settings.TCO_SITE_URL if absolute else "") + path


def alert_recipients(team: Team) -> list[str]:
    """The e-mail addresses of ``team``'s leads and of every admin (staff or superuser), sorted."""
    leads = Membership.objects.filter(team=team, role=Role.LEAD, user__is_active=True).exclude(user__email="")
    admins = (get_user_model().objects.filter(is_active=True).filter(Q(is_staff=True) | Q(is_superuser=True))
              .exclude(email=""))
    return sorted({*leads.values_list("user__email", flat=True), *admins.values_list("email", flat=True)})


def alertmanager_alert(alert: AnomalyAlert) -> dict[str, Any]:
    """One alert in Alertmanager's shape: ``{"labels", "annotations", "startsAt", "endsAt", "generatorURL"}``.

    Labels: ``alertname`` (``ALERT_NAMES``), ``severity``, ``team``, ``project``, ``kind`` and, where
    there is one, ``campaign`` (name) and ``campaign_id``; annotations: ``summary`` (the title),
    ``description`` (the text), ``tco_alert_id``.
    """
    labels = {"alertname": ALERT_NAMES[alert.kind], "severity": alert.severity, "team": alert.team.name,
              "project": alert.team.project, "kind": alert.kind, "source": "tco"}
    if alert.campaign_id is not None:
        labels.update(campaign=alert.campaign.name, campaign_id=str(alert.campaign_id))
    if alert.budget_id is not None:
        labels["period"] = alert.budget.period
    return {"labels": labels,
            "annotations": {"summary": alert.title, "description": alert.text, "tco_alert_id": str(alert.pk)},
            "startsAt": alert.starts_at.isoformat().replace("+00:00", "Z"), "endsAt": NO_END,
            "generatorURL": alert_link(alert)}


def webhook_payload(alerts: Sequence[AnomalyAlert], *, form: str | None = None) -> Any:
    """The JSON body for ``alerts`` in ``form`` (``TCO_ALERT_WEBHOOK_FORMAT``): Alertmanager's webhook
    message (``"webhook"``) or its API's alert list (``"alertmanager"``)."""
    form = form or settings.TCO_ALERT_WEBHOOK_FORMAT
    items = [alertmanager_alert(a) for a in alerts]
    if form == "alertmanager":
        return [{k: v for k, v in item.items() if k != "endsAt"} for item in items]
    for item, alert in zip(items, alerts):
        item["status"] = "firing"
        item["fingerprint"] = hashlib.sha256(alert.key.encode()).hexdigest()[:16]
    common = set.intersection(*(set(i["labels"].items()) for i in items)) if items else set()
    group = {"alertname": items[0]["labels"]["alertname"]} if len({i["labels"]["alertname"] for i in items}) == 1 \
        else {}
    return {"version": "4", "groupKey": "{}:" + json.dumps(group, sort_keys=True), "truncatedAlerts": 0,
            "status": "firing", "receiver": "tco", "groupLabels": group, "commonLabels": dict(sorted(common)),
            "commonAnnotations": {}, "externalURL": settings.TCO_SITE_URL, "alerts": items}


def webhook_error(payload: Any, url: str | None = None) -> str:
    """POST ``payload`` as JSON to ``url`` (``TCO_ALERT_WEBHOOK_URL``): "" when it answered 2xx, else why not."""
    url = url or settings.TCO_ALERT_WEBHOOK_URL
    headers = {"Content-Type": "application/json", "User-Agent": "tco-alerts"}
    if settings.TCO_ALERT_WEBHOOK_TOKEN:
        headers["Authorization"] = f"Bearer {settings.TCO_ALERT_WEBHOOK_TOKEN}"
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=settings.TCO_ALERT_WEBHOOK_TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} {exc.reason}"[:300]
    except (OSError, ValueError) as exc:  # refused, timed out, bad URL: the alert stays on the pages
        log.warning("alert webhook %s failed", url, exc_info=True)
        return f"{type(exc).__name__}: {exc}"[:300]
    return "" if 200 <= status < 300 else f"HTTP {status}"


def alert_deliver(alert_id: int) -> dict[str, str | None]:
    """Mail and post one alert (each at most once: called once, after the alert commits).

    Returns ``{"mail": error | "" | None (not tried), "webhook": error | "" | None}`` and audits
    each tried delivery.
    """
    alert = AnomalyAlert.objects.select_related("team", "campaign", "budget").filter(pk=alert_id).first()
    if alert is None:
        return {"mail": None, "webhook": None}
    result: dict[str, str | None] = {"mail": None, "webhook": None}
    target = f"anomaly_alert:{alert.pk}"
    if settings.TCO_ALERT_EMAIL:
        recipients = alert_recipients(alert.team)
        body = f"{alert.text}\n\n{alert_link(alert)}\n"
        error = mail_error(f"[tco] {alert.title}", body, recipients)
        result["mail"] = error
        audit(user=None, action=MAIL_ACTION, target=target, params={"recipients": len(recipients)}, ok=not error,
              result=f"not sent: {error}" if error else f"sent to {len(recipients)} address(es)")
    if settings.TCO_ALERT_WEBHOOK_URL:
        error = webhook_error(webhook_payload([alert]))
        result["webhook"] = error
        audit(user=None, action=WEBHOOK_ACTION, target=target, params={"format": settings.TCO_ALERT_WEBHOOK_FORMAT},
              ok=not error, result=f"not sent: {error}" if error else "posted")
    return result
