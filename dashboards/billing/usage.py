"""Token and cost totals per project for ``/metrics`` (unscoped; finished campaigns cached)."""
from __future__ import annotations

from typing import Any

from django.core.cache import cache
from django.db.models import IntegerField, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from dashboards.core.chunks import in_chunks
from dashboards.core.stages import iso as _iso
from dashboards.core.states import TOKEN_FIELDS, UNFINISHED_CAMPAIGN
from dashboards.models import Campaign, Task


USAGE_FIELDS = (*TOKEN_FIELDS, "reasoning_tokens", "cost_usd")
#: The runners' trace counts (the record's ``telemetry``, execution/metering/otel.py), spans.
OTEL_FIELDS = {"otel_spans_exported": "spans_exported", "otel_spans_dropped": "spans_dropped"}


def _campaign_usage(campaign_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Token and cost sums per campaign: ``{id: {input_tokens, ..., cost_usd (Decimal), otel_spans_exported,
    otel_spans_dropped}}`` (the span counts: None when no runner traced)."""
    found: dict[int, dict[str, Any]] = {}
    for chunk in in_chunks(campaign_ids):
        for row in (Task.objects.filter(campaign_id__in=chunk).values("campaign_id")
                    .annotate(**{f: Sum(f) for f in USAGE_FIELDS},
                              **{f: Sum(Cast(KT(f"runner_record__telemetry__{key}"), IntegerField()))
                                 for f, key in OTEL_FIELDS.items()}).order_by()):
            found[row.pop("campaign_id")] = row
    return found


def usage_by_project() -> list[dict[str, Any]]:
    """Every campaign task's token and cost totals per project, for /metrics (unscoped).

    ``[{"project", "input_tokens", ..., "reasoning_tokens", "cost_usd" (Decimal), "otel_spans_exported",
    "otel_spans_dropped"}]`` (spans the runners' traces sent and lost, docs/otel.md).
    Only tco's campaigns are metered. A finished campaign's sums no longer
    change and are cached per campaign for a day, so a scrape reads the tasks
    of unfinished campaigns only (after the first).
    """
    campaigns = list(Campaign.objects.values_list("pk", "status", "finished_at", "team__project"))
    keys = {pk: f"campaign-usage:{pk}:{_iso(finished_at)}" for pk, status, finished_at, _ in campaigns
            if status not in UNFINISHED_CAMPAIGN}
    cached = cache.get_many(list(keys.values())) if keys else {}
    sums: dict[int, dict[str, Any]] = {pk: cached[key] for pk, key in keys.items() if key in cached}
    missing = [pk for pk, *_ in campaigns if pk not in sums]
    fresh = _campaign_usage(missing)
    to_cache = {keys[pk]: fresh.get(pk, {}) for pk in missing if pk in keys}
    if to_cache:
        cache.set_many(to_cache, 86400)
    sums.update(fresh)
    per_project: dict[str, dict[str, Any]] = {}
    for pk, _status, _finished, project in campaigns:
        row = sums.get(pk) or {}
        total = per_project.setdefault(project, {"project": project, **{f: 0 for f in (*USAGE_FIELDS, *OTEL_FIELDS)}})
        for f in (*USAGE_FIELDS, *OTEL_FIELDS):
            total[f] += row.get(f) or 0
    return [per_project[p] for p in sorted(per_project)]
