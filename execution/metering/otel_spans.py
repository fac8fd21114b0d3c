"""The spans of one task's trace as data, before the OpenTelemetry SDK sees them (docs/otel.md).

Built from the metering proxy's request records and the runner record's stages; imports no
OpenTelemetry (``execution.metering.otel`` hands them to the SDK):

- :func:`agent_span_attributes`: the ``invoke_agent`` span's attributes;
- :func:`chat_span`: one CLIENT span per request the metering proxy handled, named
  ``"{gen_ai.operation.name} {gen_ai.request.model}"`` (built from the proxy's request record, so
  the tokens are exactly the metered ones);
- :func:`stage_spans`: one INTERNAL span per stage (``queue wait``, ``sandbox start``, ``agent``,
  ``integration``; times from the runner record's stages);
- :class:`TraceParent`: the W3C ``traceparent`` that makes them children of the launch's span.

Token attributes follow the GenAI semantic conventions (status Development):
``gen_ai.usage.input_tokens`` counts every input token (uncached, cache reads
and cache writes, as the conventions ask), ``gen_ai.usage.cache_read.input_tokens``
and ``gen_ai.usage.cache_creation.input_tokens`` (5-minute plus 1-hour
writes) are parts of it, ``gen_ai.usage.output_tokens`` includes reasoning.
tco's own disjoint buckets are there too, as ``tco.usage.<bucket>``. Cost
(``gen_ai.usage.cost.amount``, USD, and ``gen_ai.usage.cost.currency``; an
open proposal, not yet a convention) only when asked (``chat_span(with_cost=True)``,
``TCO_OTEL_COST`` = ``1``).
"""
from __future__ import annotations

import datetime as dt
import re
import secrets
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping
from urllib.parse import urlsplit

from execution.metering.usage import PROVIDER_OF_API, api_for_path
from execution.spool.contract import TOKEN_FIELDS

__all__ = ["TraceParent", "SpanFields", "chat_span", "stage_spans", "agent_span_attributes", "iso_ns",
           "operation_of", "STAGE_SPANS", "COST_CURRENCY"]

COST_CURRENCY = "USD"

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True)
class TraceParent:
    """A W3C Trace Context ``traceparent`` (version 00): 128-bit ``trace_id``, 64-bit ``span_id`` (the
    parent span), ``flags`` (bit 0: sampled)."""

    trace_id: int
    span_id: int
    flags: int = 1

    def text(self) -> str:
        """``00-<32 hex>-<16 hex>-<2 hex>``."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"

    @classmethod
    def parse(cls, text: str | None) -> "TraceParent | None":
        """The value of a ``traceparent`` header or ``TRACEPARENT`` variable; None when absent or not
        valid (version ``ff``, an all-zero id, wrong lengths or upper-case hex, as the specification says)."""
        match = _TRACEPARENT.match((text or "").strip())
        if match is None or match.group(1) == "ff" or (match.group(1) == "00" and match.group(5)):
            return None
        trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
        if not trace_id or not span_id:
            return None
        return cls(trace_id, span_id, int(match.group(4), 16))

    @classmethod
    def new(cls) -> "TraceParent":
        """A new sampled trace with a random parent span id."""
        return cls(secrets.randbits(128) or 1, secrets.randbits(64) or 1, 1)


def iso_ns(text: str | None) -> int | None:
    """ISO-8601 time with a zone (``...Z`` or ``+00:00``, as the runner and proxy write them) as integer
    nanoseconds since the Unix epoch; None for None, "" or text that is not such a time."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    if moment.tzinfo is None:
        return None
    return (moment - _EPOCH) // dt.timedelta(microseconds=1) * 1000


@dataclass
class SpanFields:
    """One span as data, before the SDK sees it: ``name``; ``kind`` ``client`` | ``internal``;
    ``start_ns``/``end_ns`` (nanoseconds since the epoch); ``attributes`` (OpenTelemetry values: str,
    bool, int, float or tuples of one of them); ``error_type`` (also ``error.type``; None: not an error)."""

    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None


def operation_of(record: Mapping[str, Any]) -> str:
    """``gen_ai.operation.name`` of a proxy record: ``chat`` for Anthropic Messages and OpenAI chat
    completions and responses, ``embeddings``, ``text_completion``, else the path's last segment
    (``count_tokens``, ``models``)."""
    usage = record.get("usage") or {}
    path = (record.get("path") or "").split("?", 1)[0]
    if (usage.get("api") or api_for_path(path)) is not None:
        return "chat"
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if last == "embeddings":
        return "embeddings"
    if last == "completions":
        return "text_completion"
    return last or "request"


def _server(upstream: str | None) -> tuple[str | None, int | None]:
    if not upstream:
        return None, None
    try:
        parts = urlsplit(upstream)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None, None
    return parts.hostname, port


def chat_span(record: Mapping[str, Any], *, with_cost: bool = False) -> SpanFields:
    """The CLIENT span of one metering proxy request record (execution/metering/proxy.py's record
    shape: ``at`` ISO start, ``latency_ms``, ``usage`` buckets in tokens, ``cost_usd`` text in USD).
    ``with_cost``: add ``gen_ai.usage.cost.amount`` (float, USD) and ``.currency`` when the request
    was priced. Raises KeyError/TypeError for a record without ``at``."""
    usage = record.get("usage") or {}
    operation = operation_of(record)
    model = record.get("model_requested")
    start = iso_ns(record["at"])
    if start is None:
        raise TypeError(f"record time {record['at']!r} is not ISO-8601 with a zone")
    end = start + int(round(float(record.get("latency_ms") or 0) * 1e6))
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation}
    path = (record.get("path") or "").split("?", 1)[0]
    provider = usage.get("provider") or PROVIDER_OF_API.get(api_for_path(path))
    if provider:
        attrs["gen_ai.provider.name"] = provider
    if model:
        attrs["gen_ai.request.model"] = model
    if record.get("model_returned"):
        attrs["gen_ai.response.model"] = record["model_returned"]
    if record.get("response_id"):
        attrs["gen_ai.response.id"] = record["response_id"]
    if record.get("finish_reasons"):
        attrs["gen_ai.response.finish_reasons"] = tuple(record["finish_reasons"])
    if usage:
        buckets = {name: int(usage.get(name) or 0) for name in TOKEN_FIELDS}
        cache_write = buckets["cache_write_5m_tokens"] + buckets["cache_write_1h_tokens"]
        attrs["gen_ai.usage.input_tokens"] = buckets["input_tokens"] + buckets["cache_read_tokens"] + cache_write
        attrs["gen_ai.usage.output_tokens"] = buckets["output_tokens"]
        attrs["gen_ai.usage.cache_read.input_tokens"] = buckets["cache_read_tokens"]
        attrs["gen_ai.usage.cache_creation.input_tokens"] = cache_write
        attrs.update({f"tco.usage.{name}": value for name, value in buckets.items()})
        attrs["tco.usage.complete"] = bool(usage.get("complete", True))
    if record.get("flags"):
        attrs["tco.usage.flags"] = tuple(str(f) for f in record["flags"])
    if with_cost and record.get("cost_usd") is not None:
        try:
            attrs["gen_ai.usage.cost.amount"] = float(Decimal(str(record["cost_usd"])))
            attrs["gen_ai.usage.cost.currency"] = COST_CURRENCY
        except InvalidOperation:
            pass
    host, port = _server(record.get("upstream"))
    if host:
        attrs["server.address"], attrs["server.port"] = host, port
    if record.get("method"):
        attrs["http.request.method"] = record["method"]
    if path:
        attrs["url.path"] = path[:2000]
    if record.get("status") is not None:
        attrs["http.response.status_code"] = int(record["status"])
    if record.get("ttfb_ms") is not None:
        attrs["tco.proxy.ttfb_ms"] = float(record["ttfb_ms"])
    if record.get("client_disconnected"):
        attrs["tco.proxy.client_disconnected"] = True
    error = None
    if record.get("refused"):
        error = str(record["refused"])
        attrs["tco.proxy.refused"] = error
    elif record.get("status") is not None and int(record["status"]) >= 400:
        error = str(record["status"])
    elif record.get("status") is None and record.get("error"):
        error = "_OTHER"
    if error is not None:
        attrs["error.type"] = error
    return SpanFields(f"{operation} {model}" if model else operation, "client", start, end, attrs, error)


#: (span name, ``tco.stage``, start stage, end stage) of each stage span, in order.
STAGE_SPANS = (
    ("sandbox start", "sandbox_start", "sandbox_create_at", "sandbox_ready_at"),
    ("agent", "agent_work", "agent_started_at", "agent_exited_at"),
)


def stage_spans(stages: Mapping[str, str | None], submitted_at: str | None = None) -> list[SpanFields]:
    """The INTERNAL stage spans of one task from the runner record's ``stages`` (ISO times, null where not
    reached) and ``submitted_at`` (ISO; when the launch submitted the job, ``TCO_SUBMITTED_AT``):

    - ``queue wait``: ``submitted_at`` -> ``task_started_at`` (0 s if the submission reads later);
    - ``sandbox start``: ``sandbox_create_at`` -> ``sandbox_ready_at``;
    - ``agent``: ``agent_started_at`` -> ``agent_exited_at`` (``teardown_done_at`` when the runner
      stopped it);
    - ``integration``: the runner's own work after the agent (its last reached stage ->
      ``teardown_done_at``), with ``tco.integration_overhead_s`` = (``teardown_done_at`` -
      ``task_started_at``) - sandbox start - agent work, the pages' "integration overhead" (seconds).

    A span whose ends are not both known is left out."""
    ns = {name: iso_ns(value) for name, value in stages.items()}
    out: list[SpanFields] = []
    started, done = ns.get("task_started_at"), ns.get("teardown_done_at")
    submitted = iso_ns(submitted_at)
    if submitted is not None and started is not None:
        out.append(SpanFields("queue wait", "internal", min(submitted, started), started,
                              {"tco.stage": "queue_wait"}))
    durations: dict[str, float] = {}
    for name, stage, begin, end in STAGE_SPANS:
        start_ns, end_ns = ns.get(begin), ns.get(end)
        if stage == "agent_work" and end_ns is None and start_ns is not None:
            end_ns = done
        if start_ns is None or end_ns is None:
            continue
        durations[stage] = (end_ns - start_ns) / 1e9
        out.append(SpanFields(name, "internal", start_ns, end_ns, {"tco.stage": stage}))
    if done is not None and started is not None:
        if ns.get("agent_started_at") is not None:
            begin = ns.get("agent_exited_at") or done
        else:  # the agent never ran: the runner's time after what it reached
            begin = ns.get("sandbox_ready_at") or ns.get("sandbox_create_at") or started
        attrs: dict[str, Any] = {"tco.stage": "integration_overhead"}
        if "agent_work" in durations:
            attrs["tco.integration_overhead_s"] = round((done - started) / 1e9 - durations.get("sandbox_start", 0.0)
                                                        - durations["agent_work"], 6)
        out.append(SpanFields("integration", "internal", min(begin, done), done, attrs))
    return out


def agent_span_attributes(*, campaign_id: str | int, task_number: int, agent_name: str | None,
                          job_number: int | None = None, model: str | None = None) -> dict[str, Any]:
    """The ``invoke_agent`` span's attributes at its start: ``gen_ai.operation.name``,
    ``gen_ai.agent.id`` (``<campaign>.<task>``), ``gen_ai.agent.name`` (``agent_name`` or ``tco-agent``),
    ``gen_ai.request.model`` when the spec names one, ``tco.campaign.id``, ``tco.task.number``,
    ``tco.job.number``."""
    attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent",
                             "gen_ai.agent.id": f"{campaign_id}.{task_number}",
                             "gen_ai.agent.name": agent_name or "tco-agent",
                             "tco.campaign.id": str(campaign_id), "tco.task.number": int(task_number)}
    if job_number is not None:
        attrs["tco.job.number"] = int(job_number)
    if model:
        attrs["gen_ai.request.model"] = model
    return attrs
