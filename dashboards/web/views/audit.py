"""The audit log page and its CSV export."""
from __future__ import annotations

import datetime as dt
import json
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboards.core import audit as core_audit
from dashboards.core import csv_export
from dashboards.core.errors import ActionRefused
from dashboards.models import AuditEntry
from dashboards.web.views.common import refused


def _audit_query(request: HttpRequest) -> tuple[dict, object, str, bool]:
    """The audit filters, sort and direction from the URL, and the matching entries (admins only)."""
    chosen = {k: request.GET.get(k, "")[:100] for k in core_audit.AUDIT_FILTERS}
    dates = {}
    for name in ("since", "until"):
        try:
            dates[name] = dt.date.fromisoformat(chosen[name]) if chosen[name] else None
        except ValueError:
            dates[name] = None
            chosen[name] = ""
    sort = request.GET.get("sort", "at")
    if sort not in core_audit.AUDIT_SORTS:
        sort = "at"
    descending = request.GET.get("dir", "desc") != "asc"
    entries = core_audit.audit_search(request.user, action=chosen["action"], who=chosen["who"], ok=chosen["ok"],
                                     q=chosen["q"], since=dates["since"], until=dates["until"], sort=sort,
                                     descending=descending)
    return chosen, entries, sort, descending


@login_required
def audit_page(request: HttpRequest) -> HttpResponse:
    try:
        chosen, entries, sort, descending = _audit_query(request)
    except ActionRefused as exc:
        return refused(request, str(exc))
    page = Paginator(entries, core_audit.AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    rows = [{"entry": e, "params": core_audit.audit_params_text(e.params), "link": core_audit.audit_target_link(e.target)}
            for e in page.object_list]
    base = {k: v for k, v in chosen.items() if v}
    columns = []
    for key, label in (("at", "When (UTC)"), ("who", "Who"), ("action", "Action"), ("target", "Target"),
                       ("ok", "OK")):
        on = key == sort
        columns.append({"key": key, "label": label, "aria": ("descending" if descending else "ascending") if on
                        else "none", "query": urlencode({**base, "sort": key,
                                                         "dir": ("asc" if descending else "desc") if on else "desc"})})
    query = urlencode({**base, "sort": sort, "dir": "desc" if descending else "asc"})
    return render(request, "dashboards/audit.html", {
        "rows": rows, "page": page, "chosen": chosen, "columns": columns, "query": query, "filtered": bool(base),
        "actions": sorted(set(AuditEntry.objects.values_list("action", flat=True).distinct())),
        "users": sorted(set(AuditEntry.objects.filter(user__isnull=False)
                            .values_list("user__username", flat=True).distinct()))})


@login_required
def audit_csv(request: HttpRequest) -> HttpResponse:
    """The audit entries of the page's filters and sort, every page, as CSV (UTF-8)."""
    try:
        _chosen, entries, _sort, _descending = _audit_query(request)
    except ActionRefused as exc:
        return refused(request, str(exc))

    header = ["at_utc", "user", "action", "target", "ok", "result", "params_json"]
    rows = ([e.at.isoformat(), e.user.get_username() if e.user else "", e.action, e.target,
             "yes" if e.ok else "no", e.result, json.dumps(e.params, sort_keys=True)]
            for e in entries.iterator(chunk_size=2000))
    return csv_export.csv_response(f"tco-audit-{timezone.now():%Y%m%d-%H%M%S}.csv", header, rows, stream=True)
