"""A FOCUS cost and usage export: tco's bill as the FinOps Open Cost and Usage Specification's rows.

FOCUS (https://focus.finops.org) is the column set FinOps tools read. This
module writes FOCUS 1.2's Cost and Usage columns (the Column IDs of the
specification's ``columns/*.md``, CHANGELOG "v1.2" for the columns it added),
then tco's own columns, prefixed ``x_`` as FOCUS's "Column naming and
ordering" asks of custom columns, after every FOCUS column.

Two kinds of rows, both ``ChargeCategory`` "Usage", ``ChargeFrequency``
"Usage-Based", one per local day of the cluster's time zone (the bill's
periods, ``billing.periods``):

- tokens: per day, team, campaign (and so its one model): the metered tokens
  (``ConsumedQuantity``, unit "Tokens") and their dollars (``BilledCost`` =
  ``EffectiveCost`` = ``ListCost`` = ``ContractedCost``: tco's price table is a
  list price without discounts). ``ServiceCategory`` "AI and Machine
  Learning", ``ServiceSubcategory`` "Generative AI". A campaign's usage without
  a price (``unpriced_tasks`` of the bill) is a row of its own with
  ``BilledCost`` 0, no unit price and ``x_UnpricedTasks`` > 0: FOCUS wants a
  unit price on usage rows, and tco never invents one.
- slot-hours: per day, team, campaign and cluster queue, from the accounting
  records (wall clock x slots, as ``qacct`` sums them): ``ConsumedQuantity`` in
  "Slot-Hours", ``BilledCost`` 0 (tco does not price slots), with
  ``x_WallclockSeconds`` and ``x_SlotSeconds`` exact to the millisecond.

A day's usage is what the bill counts (``billing.bills``, ``USAGE_DEFINITION``):
the tasks of tco's campaigns that started in it and their accounting records;
jobs run under a team's project that tco did not launch are not in a team's
bill and not in this file. So for the same teams and days, the sum of
``BilledCost`` is the bill's ``cost_usd``, the sums of ``x_WallclockSeconds``
and ``x_SlotSeconds`` its ``wallclock_s`` and ``slot_s``, and the token
columns its tokens (tests/db/test_focus.py checks both against each other).

Campaign, queue, model and cluster are both ``Tags`` (a JSON object, keys
``tco/campaign``, ``tco/campaign-id``, ``tco/queue``, ``tco/model``,
``tco/cluster``) and ``x_`` columns. Times are UTC ISO 8601 with ``Z`` (FOCUS
"Date/Time Format"); money is USD (ISO 4217, FOCUS "Currency Code Format") as
exact decimals.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Iterator, Sequence

from django.conf import settings
from django.db.models import BigIntegerField, Count, DateField, ExpressionWrapper, F, FloatField, Q, Sum
from django.db.models.functions import Round, Trunc

from dashboards.billing.bills import BUCKETS, COST_UNITS, model_expr, used_tokens_q, whole_hour
from dashboards.billing.periods import cluster_zone, local_midnight, next_period_start, period_start
from dashboards.core.errors import BillError
from dashboards.models import AccountingRecord, Cluster, ModelRequest, RequestRollup, Task, Team

FOCUS_VERSION = "1.2"

#: FOCUS 1.2 Cost and Usage columns (Column IDs), in the order written.
FOCUS_COLUMNS = (
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingAccountType",
    "BillingCurrency", "BillingPeriodEnd", "BillingPeriodStart", "CapacityReservationId",
    "CapacityReservationStatus", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency",
    "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory", "CommitmentDiscountId",
    "CommitmentDiscountName", "CommitmentDiscountQuantity", "CommitmentDiscountStatus", "CommitmentDiscountType",
    "CommitmentDiscountUnit", "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice",
    "EffectiveCost", "InvoiceId", "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory",
    "PricingCurrency", "PricingCurrencyContractedUnitPrice", "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "RegionId",
    "RegionName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName",
    "ServiceSubcategory", "SkuId", "SkuMeter", "SkuPriceDetails", "SkuPriceId", "SubAccountId", "SubAccountName",
    "SubAccountType", "Tags",
)
#: tco's own columns (FOCUS: custom columns start with ``x_`` and follow the FOCUS columns).
X_COLUMNS = (
    "x_Cluster", "x_Project", "x_CampaignId", "x_CampaignName", "x_Queue", "x_Model", "x_Tasks",
    "x_AccountingRecords", "x_InputTokens", "x_CacheReadTokens", "x_CacheWrite5mTokens", "x_CacheWrite1hTokens",
    "x_OutputTokens", "x_ReasoningTokens", "x_UnpricedTasks", "x_WallclockSeconds", "x_SlotSeconds",
)
COLUMNS = FOCUS_COLUMNS + X_COLUMNS
_X_BUCKETS = {"input_tokens": "x_InputTokens", "cache_read_tokens": "x_CacheReadTokens",
              "cache_write_5m_tokens": "x_CacheWrite5mTokens", "cache_write_1h_tokens": "x_CacheWrite1hTokens",
              "output_tokens": "x_OutputTokens"}
CURRENCY = "USD"
TOKENS_UNIT = "Tokens"
SLOT_HOURS_UNIT = "Slot-Hours"
#: Decimal places of a blended unit price (USD per token; a cent per 10^12 tokens is below any price).
UNIT_PRICE_PLACES = Decimal("1e-15")
SECONDS = Decimal("0.001")
SLOT_HOURS = Decimal("1e-9")


@dataclass(frozen=True)
class Window:
    """What an export covers: UTC ``[since, until)``, or the local days ``first``..``last`` of each
    cluster's time zone (the bill's days). Exactly one of the two pairs is given."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    first: dt.date | None = None
    last: dt.date | None = None

    def bounds(self, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
        """``[begin, end)`` in UTC for a cluster in ``tz``."""
        if self.first is not None and self.last is not None:
            return local_midnight(self.first, tz), local_midnight(self.last + dt.timedelta(days=1), tz)
        assert self.since is not None and self.until is not None
        return self.since, self.until


def window(*, since: dt.datetime | None = None, until: dt.datetime | None = None, first: dt.date | None = None,
           last: dt.date | None = None) -> Window:
    """A checked :class:`Window`; raises ``BillError`` when both or neither pair is given, the end
    is not after the start, or it spans more than ``MAX_DAYS`` days."""
    days = (first is not None) + (last is not None)
    times = (since is not None) + (until is not None)
    if not ((days == 2 and times == 0) or (times == 2 and days == 0)):
        raise BillError("a FOCUS export covers either since..until or first..last")
    if days:
        if last < first:
            raise BillError("the last day is before the first day")
        span = (last - first).days + 1
    else:
        if since.tzinfo is None or until.tzinfo is None:
            raise BillError("since and until need a time zone")
        if until <= since:
            raise BillError("until must be after since")
        span = (until - since).total_seconds() / 86400
    if span > MAX_DAYS:
        raise BillError(f"a FOCUS export covers at most {MAX_DAYS} days")
    return Window(since=since, until=until, first=first, last=last)


#: The longest export (days): a year and a day of daily rows.
MAX_DAYS = 400


def focus_rows(*, teams: Iterable[Team], window: Window,
               clusters: Sequence[Cluster] | None = None) -> list[dict[str, str]]:
    """The FOCUS rows of ``teams``' usage in ``window``: ``[{column: text}]`` with every key of
    ``COLUMNS`` ("" is null), sorted by charge period, team, kind (tokens first), campaign, queue.

    Values are text as written to the CSV: decimals without exponent (``BilledCost`` USD with up
    to 8 places, tco's precision), times ``YYYY-MM-DDTHH:MM:SSZ``, ``Tags`` a JSON object.
    Sources: ``Task`` (tokens, cost; tasks of tco's campaigns by the start of their last run) and
    ``AccountingRecord`` (wall clock x slots; records of those tasks), per cluster in its time
    zone (the bill's definition, ``billing.bills._accumulate``).
    """
    teams = list(teams)
    team_of = {t.project: t for t in teams}
    clusters = list(clusters) if clusters is not None else list(Cluster.objects.order_by("name"))
    out: list[tuple[tuple, dict[str, str]]] = []
    for cluster in clusters if team_of else ():
        tz = cluster_zone(cluster)
        begin, end = window.bounds(tz)
        day = Trunc("started_at", "day", output_field=DateField(), tzinfo=tz)
        for item in _token_usage(cluster, begin, end, list(team_of), day):
            row = _token_row(cluster, tz, begin, end, team_of[item["project"]], item)
            out.append(((row["ChargePeriodStart"], item["project"], 0, item["campaign_id"], item["priced"]), row))
        for item in _slot_usage(cluster, begin, end, list(team_of), day):
            row = _slot_row(cluster, tz, begin, end, team_of[item["project"]], item)
            out.append(((row["ChargePeriodStart"], item["project"], 1, item["campaign_id"], item["queue"]), row))
    out.sort(key=lambda pair: pair[0])
    return [row for _key, row in out]


def _token_usage(cluster: Cluster, begin: dt.datetime, end: dt.datetime, projects: list[str], day) -> list[dict]:
    """Tokens and cost per (local day, project, campaign, model, priced) of tco's tasks started in
    ``[begin, end)``; ``priced`` False gathers the tasks whose tokens have no price."""
    tasks = (Task.objects.filter(cluster=cluster, campaign__isnull=False, started_at__gte=begin, started_at__lt=end,
                                 campaign__team__project__in=projects)
             .annotate(day=day, project_=F("campaign__team__project"), model_=model_expr(""),
                       campaign_name=F("campaign__name")))
    sums = {bucket: Sum(bucket) for bucket in (*BUCKETS, "reasoning_tokens")}
    cost = Sum(Round(F("cost_usd") * COST_UNITS), output_field=BigIntegerField())
    rows = []
    unpriced = Q(cost_usd__isnull=True) & used_tokens_q()
    for priced, part in ((True, tasks.exclude(unpriced)), (False, tasks.filter(unpriced))):
        for item in (part.values("day", "project_", "campaign_id", "campaign_name", "model_")
                     .annotate(n=Count("id"), cost=cost, **sums).order_by()):
            tokens = sum(int(item[b] or 0) for b in BUCKETS)
            cost_usd = Decimal(int(item["cost"] or 0)) / COST_UNITS
            if not tokens and not cost_usd:
                continue  # tasks that used no model: nothing to charge
            rows.append({**item, "project": item["project_"], "model": item["model_"], "priced": priced,
                         "tokens": tokens, "cost_usd": cost_usd})
    publishers = _publishers(cluster, begin, end, {r["campaign_id"] for r in rows})
    for row in rows:
        row["publisher"] = publishers.get(row["campaign_id"], "")
    return rows


def _publishers(cluster: Cluster, begin: dt.datetime, end: dt.datetime, campaigns: set[int]) -> dict[int, str]:
    """campaign id -> the model providers its metered requests went to (``ModelRequest.provider``),
    joined with " + "; for FOCUS ``PublisherName`` (who produced the service: the model's vendor).
    The requests of tasks started in ``[begin, end)``: where both are whole UTC hours, the ended
    tasks' from the request rollups (``RequestRollup``) and the active tasks' from their rows; else
    every request row of the range's tasks."""
    if not campaigns:
        return {}
    found: dict[int, set[str]] = {}
    requests = ModelRequest.objects.filter(task__cluster=cluster, task__campaign_id__in=campaigns,
                                           task__started_at__gte=begin, task__started_at__lt=end)
    pairs = []
    if whole_hour(begin) and whole_hour(end):
        pairs += (RequestRollup.objects.filter(cluster=cluster, hour__gte=begin, hour__lt=end,
                                               campaign_id__in=campaigns, requests__gt=0)
                  .exclude(provider="").values_list("campaign_id", "provider").distinct())
        requests = requests.filter(task__active=True)
    pairs += requests.exclude(provider="").values_list("task__campaign_id", "provider").distinct()
    for campaign_id, provider in pairs:
        found.setdefault(campaign_id, set()).add(provider)
    return {c: " + ".join(sorted(p)) for c, p in found.items()}


def _slot_usage(cluster: Cluster, begin: dt.datetime, end: dt.datetime, projects: list[str], day) -> list[dict]:
    """Wall clock and slot-seconds per (local day, project, campaign, queue) of the accounting
    records of tco's tasks started in ``[begin, end)`` (every record, as qacct sums them)."""
    records = (AccountingRecord.objects.filter(cluster=cluster, started_at__gte=begin, started_at__lt=end,
                                               task__campaign__isnull=False,
                                               task__campaign__team__project__in=projects)
               .annotate(day=day, project_=F("task__campaign__team__project"), campaign_id=F("task__campaign_id"),
                         campaign_name=F("task__campaign__name"), model_=model_expr("task__")))
    slot_s = ExpressionWrapper(F("wallclock_s") * F("slots"), output_field=FloatField())
    return [{**item, "project": item["project_"], "model": item["model_"]}
            for item in (records.values("day", "project_", "campaign_id", "campaign_name", "model_", "queue")
                         .annotate(n=Count("id"), tasks=Count("task_id", distinct=True), wall=Sum("wallclock_s"),
                                   slot=Sum(slot_s)).order_by())]


def _decimal(value: Decimal | None) -> str:
    """A decimal as FOCUS numeric text: no exponent, no trailing zeros; None is null ("")."""
    if value is None:
        return ""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def iso_z(moment: dt.datetime) -> str:
    """A UTC time as FOCUS's date/time format: ``YYYY-MM-DDTHH:MM:SSZ``."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _common(cluster: Cluster, tz: dt.tzinfo, begin: dt.datetime, end: dt.datetime, team: Team,
            item: dict[str, Any]) -> dict[str, str]:
    """The columns both kinds of rows fill alike: accounts, periods, campaign, tags."""
    day: dt.date = item["day"]
    charge_start = max(local_midnight(day, tz), begin)
    charge_end = min(local_midnight(day + dt.timedelta(days=1), tz), end)
    month = period_start(day, "month")
    provider = settings.TCO_FOCUS_PROVIDER_NAME
    tags = {"tco/cluster": cluster.name, "tco/campaign": item["campaign_name"],
            "tco/campaign-id": str(item["campaign_id"]), "tco/model": item["model"]}
    if item.get("queue"):
        tags["tco/queue"] = item["queue"]
    row = dict.fromkeys(COLUMNS, "")
    row.update({
        "BillingAccountId": settings.TCO_FOCUS_BILLING_ACCOUNT_ID,
        "BillingAccountName": settings.TCO_FOCUS_BILLING_ACCOUNT_NAME,
        "BillingAccountType": "Site",
        "BillingCurrency": CURRENCY, "PricingCurrency": CURRENCY,
        "BillingPeriodStart": iso_z(local_midnight(month, tz)),
        "BillingPeriodEnd": iso_z(local_midnight(next_period_start(month, "month"), tz)),
        "ChargeCategory": "Usage", "ChargeFrequency": "Usage-Based", "PricingCategory": "Standard",
        "ChargePeriodStart": iso_z(charge_start), "ChargePeriodEnd": iso_z(charge_end),
        "InvoiceIssuerName": provider, "ProviderName": provider,
        "ResourceId": f"tco/{cluster.name}/campaign/{item['campaign_id']}",
        "ResourceName": item["campaign_name"], "ResourceType": "Campaign",
        "SubAccountId": team.project, "SubAccountName": team.name, "SubAccountType": "Team",
        "Tags": json.dumps(tags, sort_keys=True, separators=(",", ":")),
        "x_Cluster": cluster.name, "x_Project": team.project, "x_CampaignId": str(item["campaign_id"]),
        "x_CampaignName": item["campaign_name"], "x_Model": item["model"],
    })
    return row


def _token_row(cluster: Cluster, tz: dt.tzinfo, begin: dt.datetime, end: dt.datetime, team: Team,
               item: dict[str, Any]) -> dict[str, str]:
    row = _common(cluster, tz, begin, end, team, item)
    cost: Decimal = item["cost_usd"]
    tokens: int = item["tokens"]
    # Buckets have prices of their own and tco meters one cost per task: the row's unit price is
    # its cost over its tokens (ListCost = ListUnitPrice x PricingQuantity, to 15 places).
    unit = (cost / tokens).quantize(UNIT_PRICE_PLACES) if item["priced"] and tokens else None
    money = _decimal(cost)
    row.update({
        "BilledCost": money, "EffectiveCost": money, "ListCost": money, "ContractedCost": money,
        "PricingCurrencyEffectiveCost": money,
        "ListUnitPrice": _decimal(unit), "ContractedUnitPrice": _decimal(unit),
        "PricingCurrencyListUnitPrice": _decimal(unit), "PricingCurrencyContractedUnitPrice": _decimal(unit),
        "ConsumedQuantity": str(tokens), "ConsumedUnit": TOKENS_UNIT,
        "PricingQuantity": str(tokens), "PricingUnit": TOKENS_UNIT,
        "ChargeDescription": (f"{item['model']} tokens of campaign {item['campaign_name']} (#{item['campaign_id']})"
                              + ("" if item["priced"] else ", without a price")),
        "PublisherName": item["publisher"] or settings.TCO_FOCUS_PROVIDER_NAME,
        "ServiceCategory": "AI and Machine Learning", "ServiceSubcategory": "Generative AI",
        "ServiceName": "Model API (metered by tco)",
        "SkuId": f"tokens/{item['model']}", "SkuPriceId": f"tokens/{item['model']}", "SkuMeter": TOKENS_UNIT,
        "x_Tasks": str(item["n"]), "x_AccountingRecords": "",
        "x_ReasoningTokens": str(int(item["reasoning_tokens"] or 0)),
        "x_UnpricedTasks": "0" if item["priced"] else str(item["n"]),
    })
    for bucket, column in _X_BUCKETS.items():
        row[column] = str(int(item[bucket] or 0))
    return row


def _slot_row(cluster: Cluster, tz: dt.tzinfo, begin: dt.datetime, end: dt.datetime, team: Team,
              item: dict[str, Any]) -> dict[str, str]:
    row = _common(cluster, tz, begin, end, team, item)
    wall = Decimal(repr(float(item["wall"] or 0.0))).quantize(SECONDS)
    slot = Decimal(repr(float(item["slot"] or 0.0))).quantize(SECONDS)
    hours = _decimal((slot / 3600).quantize(SLOT_HOURS))
    row.update({
        "BilledCost": "0", "EffectiveCost": "0", "ListCost": "0", "ContractedCost": "0",
        "PricingCurrencyEffectiveCost": "0", "ListUnitPrice": "0", "ContractedUnitPrice": "0",
        "PricingCurrencyListUnitPrice": "0", "PricingCurrencyContractedUnitPrice": "0",
        "ConsumedQuantity": hours, "ConsumedUnit": SLOT_HOURS_UNIT,
        "PricingQuantity": hours, "PricingUnit": SLOT_HOURS_UNIT,
        "ChargeDescription": (f"slot-hours of campaign {item['campaign_name']} (#{item['campaign_id']}) "
                              f"in {item['queue']}"),
        "PublisherName": settings.TCO_FOCUS_PROVIDER_NAME,
        "ServiceCategory": "Compute", "ServiceSubcategory": "Other (Compute)",
        "ServiceName": "Grid Engine slots",
        "SkuId": f"slots/{cluster.name}/{item['queue']}", "SkuPriceId": f"slots/{cluster.name}/{item['queue']}",
        "SkuMeter": SLOT_HOURS_UNIT,
        "x_Queue": item["queue"], "x_Tasks": str(item["tasks"]), "x_AccountingRecords": str(item["n"]),
        "x_UnpricedTasks": "0", "x_WallclockSeconds": _decimal(wall), "x_SlotSeconds": _decimal(slot),
    })
    for column in (*_X_BUCKETS.values(), "x_ReasoningTokens"):
        row[column] = "0"
    return row


def focus_csv_rows(rows: Iterable[dict[str, str]]) -> Iterator[list[str]]:
    """``rows`` (:func:`focus_rows`) as CSV rows, the header (``COLUMNS``) first."""
    yield list(COLUMNS)
    for row in rows:
        yield [row[c] for c in COLUMNS]


def focus_filename(window: Window) -> str:
    """The download's name: ``tco-focus-1.2-<first>-<last>.csv`` (days, or UTC times)."""
    if window.first is not None:
        span = f"{window.first.isoformat()}-{window.last.isoformat()}"
    else:
        span = f"{window.since.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{window.until.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    return f"tco-focus-{FOCUS_VERSION}-{span}.csv"
