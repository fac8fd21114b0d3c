"""OpenTelemetry GenAI spans (execution/metering/otel_spans.py, otel.py) built without a receiver, and over the wire.

The SDK's in-memory exporter holds what would be sent; the wire test posts through the real
OTLP/HTTP exporter to a receiver on 127.0.0.1 started here and decodes the protobuf body.
"""
from __future__ import annotations

import datetime as dt
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from execution.metering.otel import TaskTracer, export_launch_span, tracing_configured, traces_url
from execution.metering.otel_spans import TraceParent, chat_span, iso_ns, stage_spans

STAGES = {"task_started_at": "2026-12-02T07:00:01.000000Z", "sandbox_create_at": "2026-12-02T07:00:01.100000Z",
          "sandbox_ready_at": "2026-12-02T07:00:01.150000Z", "agent_started_at": "2026-12-02T07:00:01.160000Z",
          "agent_exited_at": "2026-12-02T07:00:03.000000Z", "teardown_done_at": "2026-12-02T07:00:03.100000Z"}
SUBMITTED = "2026-12-02T07:00:00.250000Z"


def record(**over) -> dict:
    """A proxy request record as execution/metering/proxy.py writes it (a streamed Anthropic answer)."""
    base = {"at": "2026-12-02T07:00:02.000000Z", "method": "POST", "path": "/v1/messages", "endpoint": "model_api",
            "status": 200, "refused": None, "model_requested": "stand-in-sonnet",
            "model_returned": "stand-in-sonnet-20261201", "stream": True,
            "usage": {"provider": "anthropic", "api": "messages", "model": "stand-in-sonnet-20261201",
                      "input_tokens": 11, "cache_read_tokens": 4000, "cache_write_5m_tokens": 300,
                      "cache_write_1h_tokens": 20, "output_tokens": 57, "reasoning_tokens": 9, "complete": True,
                      "flags": [], "total_tokens": 4388},
            "cost_usd": "0.002131", "priced_as": "stand-in-sonnet", "ttfb_ms": 12.5, "latency_ms": 120.25,
            "complete": True, "client_disconnected": False, "flags": [], "credential": "stand-in",
            "response_id": "msg_01abc", "finish_reasons": ["end_turn"], "upstream": "http://127.0.0.1:8123"}
    return {**base, **over}


def test_tracing_is_off_without_an_endpoint_and_on_with_either_variable():
    assert not tracing_configured({})
    assert not tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    assert tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert traces_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert traces_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                       "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"}) == "http://t:9/x"


def test_traceparent_round_trip_and_invalid_values():
    parent = TraceParent.parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert parent == TraceParent(0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, 1)
    assert parent.text() == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for bad in (None, "", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-4bf9-00f0-01"):
        assert TraceParent.parse(bad) is None, bad
    fresh = TraceParent.new()
    assert TraceParent.parse(fresh.text()) == fresh and fresh.flags == 1


def test_chat_span_carries_the_metered_tokens_by_the_conventions():
    span = chat_span(record(), with_cost=True)
    assert span.name == "chat stand-in-sonnet" and span.kind == "client" and span.error_type is None
    assert span.start_ns == iso_ns("2026-12-02T07:00:02.000000Z") == 1796194802 * 10**9
    assert span.end_ns - span.start_ns == 120_250_000
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "anthropic"
    assert a["gen_ai.request.model"] == "stand-in-sonnet"
    assert a["gen_ai.response.model"] == "stand-in-sonnet-20261201"
    assert a["gen_ai.response.id"] == "msg_01abc" and a["gen_ai.response.finish_reasons"] == ("end_turn",)
    # Every input token (uncached 11 + cache reads 4000 + writes 300 + 20), as the conventions count them.
    assert a["gen_ai.usage.input_tokens"] == 4331
    assert a["gen_ai.usage.cache_read.input_tokens"] == 4000
    assert a["gen_ai.usage.cache_creation.input_tokens"] == 320
    assert a["gen_ai.usage.output_tokens"] == 57
    assert [a[f"tco.usage.{b}"] for b in ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens",
                                          "cache_write_1h_tokens", "output_tokens", "reasoning_tokens")] == \
        [11, 4000, 300, 20, 57, 9]
    assert a["gen_ai.usage.cost.amount"] == pytest.approx(0.002131) and a["gen_ai.usage.cost.currency"] == "USD"
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", 8123)
    assert a["http.response.status_code"] == 200 and "error.type" not in a
    assert "gen_ai.usage.cost.amount" not in chat_span(record()).attributes  # the setting is off by default


def test_chat_span_errors_refusals_and_other_apis():
    refused = chat_span(record(status=403, refused="task_token_cap", usage=None, model_returned=None,
                               response_id=None, finish_reasons=[], upstream=None))
    assert refused.error_type == "task_token_cap" == refused.attributes["error.type"]
    assert "gen_ai.usage.input_tokens" not in refused.attributes and "server.address" not in refused.attributes
    limited = chat_span(record(status=429, usage=None))
    assert limited.error_type == "429"
    openai = chat_span(record(path="/v1/chat/completions", model_requested="gpt-x", usage=None,
                              upstream="https://api.example.com"))
    assert openai.name == "chat gpt-x" and openai.attributes["gen_ai.provider.name"] == "openai"
    assert openai.attributes["server.port"] == 443
    embeddings = chat_span(record(path="/v1/embeddings", model_requested="emb", usage=None))
    assert embeddings.name == "embeddings emb" and "gen_ai.provider.name" not in embeddings.attributes
    assert chat_span(record(path="/v1/models", method="GET", model_requested=None, usage=None)).name == "models"


def test_stage_spans_follow_the_runner_record():
    spans = {s.name: s for s in stage_spans(STAGES, SUBMITTED)}
    assert list(spans) == ["queue wait", "sandbox start", "agent", "integration"]
    assert all(s.kind == "internal" for s in spans.values())
    assert (spans["queue wait"].start_ns, spans["queue wait"].end_ns) == (iso_ns(SUBMITTED),
                                                                          iso_ns(STAGES["task_started_at"]))
    assert spans["sandbox start"].end_ns - spans["sandbox start"].start_ns == 50_000_000
    assert spans["agent"].end_ns - spans["agent"].start_ns == 1_840_000_000
    assert spans["integration"].end_ns - spans["integration"].start_ns == 100_000_000
    # The pages' integration overhead: 2.1 s in all, less 0.05 s sandbox start and 1.84 s agent work.
    assert spans["integration"].attributes["tco.integration_overhead_s"] == pytest.approx(0.21)
    # A submission that reads after the start (clock skew) is a queue wait of 0, never negative.
    late = stage_spans(STAGES, "2026-12-02T07:00:05.000000Z")[0]
    assert late.start_ns == late.end_ns
    # An agent the runner stopped: agent work runs to the teardown; no submission: no queue wait.
    stopped = {s.name: s for s in stage_spans({**STAGES, "agent_exited_at": None})}
    assert "queue wait" not in stopped and stopped["agent"].end_ns == iso_ns(STAGES["teardown_done_at"])


def tracer_with_memory(env=None, **kw) -> tuple[TaskTracer, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://unused", "TCO_AGENT_NAME": "review",
           "TCO_SUBMITTED_AT": SUBMITTED, **(env or {})}
    return TaskTracer(env, campaign_id=7, task_number=3, job_number=42, exporter=memory, **kw), memory


def test_a_task_trace_is_one_invoke_agent_span_over_its_calls_and_stages():
    parent = TraceParent.new()
    tracer, memory = tracer_with_memory({"TRACEPARENT": parent.text()})
    assert tracer.start(STAGES["task_started_at"])
    tracer.record_sink(record())
    tracer.record_sink(record(at="2026-12-02T07:00:02.500000Z", response_id="msg_2"))
    telemetry = tracer.finish(STAGES, model="stand-in-sonnet", exit_code=0, flags=[])
    assert telemetry == {"spans": 7, "spans_exported": 7, "spans_dropped": 0, "error": None}
    spans = memory.get_finished_spans()
    agent = next(s for s in spans if s.name == "invoke_agent review")
    assert agent.kind == SpanKind.INTERNAL
    assert agent.parent.span_id == parent.span_id and agent.context.trace_id == parent.trace_id
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.id"] == "7.3" and agent.attributes["gen_ai.agent.name"] == "review"
    assert agent.attributes["gen_ai.request.model"] == "stand-in-sonnet"
    assert agent.start_time == iso_ns(SUBMITTED) and agent.end_time == iso_ns(STAGES["teardown_done_at"])
    children = [s for s in spans if s is not agent]
    assert all(s.parent.span_id == agent.context.span_id and s.context.trace_id == parent.trace_id for s in children)
    kinds = {s.name: s.kind for s in children}
    assert kinds == {"chat stand-in-sonnet": SpanKind.CLIENT, "queue wait": SpanKind.INTERNAL,
                     "sandbox start": SpanKind.INTERNAL, "agent": SpanKind.INTERNAL,
                     "integration": SpanKind.INTERNAL}
    chats = [s for s in children if s.kind == SpanKind.CLIENT]
    assert sorted(s.attributes["gen_ai.response.id"] for s in chats) == ["msg_01abc", "msg_2"]
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in chats) == 114


def test_errors_are_marked_and_a_task_without_traceparent_is_a_root():
    tracer, memory = tracer_with_memory()
    tracer.start(STAGES["task_started_at"])
    tracer.record_sink(record(status=403, refused="not_in_policy", usage=None))
    tracer.record_sink({"no": "time"})  # a record a span cannot be made from: skipped, noted, never raised
    tracer.finish(STAGES, exit_code=3, flags=[])
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert spans["chat stand-in-sonnet"].status.status_code == StatusCode.ERROR
    agent = spans["invoke_agent review"]
    assert agent.parent is None and agent.attributes["error.type"] == "exit_status"
    assert agent.status.status_code == StatusCode.ERROR and tracer.error.startswith("span not made")


class Failing(InMemorySpanExporter):
    def export(self, spans):
        return SpanExportResult.FAILURE


class Slow(InMemorySpanExporter):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(30)
        return super().export(spans)


def test_lost_spans_are_counted_not_waited_for():
    failing = TaskTracer({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, campaign_id=1, task_number=1,
                         exporter=Failing())
    failing.start(STAGES["task_started_at"])
    assert failing.finish(STAGES)["spans_dropped"] == 4  # three stages (no submission time) and the agent
    # A bounded queue: 4 places, a receiver that does not answer; the flush gives up after 0.2 s.
    slow = Slow()
    tracer = TaskTracer({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, campaign_id=1, task_number=1, exporter=slow,
                        max_queue_size=4, schedule_delay_s=60)
    tracer.start(STAGES["task_started_at"])
    for n in range(10):
        tracer.record_sink(record(response_id=f"msg_{n}"))
    telemetry = tracer.finish(STAGES, flush_s=0.2)
    slow.release.set()
    assert telemetry["spans"] == 14 and telemetry["spans_exported"] == 0 and telemetry["spans_dropped"] == 14


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each decoded ExportTraceServiceRequest and its headers."""

    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append((self.path, dict(self.headers), request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    # shutdown() waits for the loop's next poll: 0.05 s, not the default 0.5 s a test.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_spans_go_over_otlp_http_protobuf_with_kinds_and_headers_from_the_file(receiver, tmp_path):
    headers = tmp_path / "otel-headers"
    headers.write_text("authorization=Basic%20cGs6c2s=,x-tenant=t1")
    parent = TraceParent.new()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}", "TRACEPARENT": parent.text(),
           "TCO_OTEL_HEADERS_FILE": str(headers), "OTEL_SERVICE_NAME": "tco-test", "TCO_SUBMITTED_AT": SUBMITTED}
    tracer = TaskTracer(env, campaign_id=9, task_number=2)
    tracer.start(STAGES["task_started_at"])
    tracer.record_sink(record())
    assert tracer.finish(STAGES, exit_code=0)["spans_exported"] == 6
    assert export_launch_span(env, parent, name="launch campaign 9", start_at="2026-12-02T07:00:00Z",
                              end_at=SUBMITTED, attributes={"tco.campaign.id": "9"})
    paths = {path for path, _, _ in Receiver.received}
    assert paths == {"/v1/traces"}
    assert all(h["authorization"] == "Basic cGs6c2s=" and h["x-tenant"] == "t1" for _, h, _ in Receiver.received)
    spans = {}
    for _, _, request in Receiver.received:
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            assert service == "tco-test"
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    spans[span.name] = span
    kind = ExportTraceServiceRequest().resource_spans.add().scope_spans.add().spans.add().SPAN_KIND_CLIENT
    assert spans["chat stand-in-sonnet"].kind == kind
    root = spans["launch campaign 9"]
    assert root.trace_id == parent.trace_id.to_bytes(16, "big") and root.span_id == parent.span_id.to_bytes(8, "big")
    assert root.parent_span_id == b""
    agent = spans["invoke_agent tco-agent"]
    assert agent.parent_span_id == root.span_id and spans["chat stand-in-sonnet"].parent_span_id == agent.span_id
    tokens = {a.key: a.value.int_value for a in spans["chat stand-in-sonnet"].attributes}
    assert tokens["gen_ai.usage.input_tokens"] == 4331 and tokens["gen_ai.usage.output_tokens"] == 57
    assert dt.datetime.fromtimestamp(agent.start_time_unix_nano / 1e9, dt.timezone.utc) == \
        dt.datetime(2026, 12, 2, 7, 0, 0, 250000, tzinfo=dt.timezone.utc)


def test_the_agent_never_sees_the_tracing_variables(tmp_path):
    from execution.runner.config import read_task
    from execution.runner.task import agent_env

    environ = {"TCO_SPOOL_DIR": str(tmp_path), "TCO_CAMPAIGN_ID": "5", "JOB_ID": "12", "SGE_TASK_ID": "2",
               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_HEADERS": "k=secret",
               "TRACEPARENT": TraceParent.new().text(), "TCO_OTEL_HEADERS_FILE": str(tmp_path / "h"),
               "TCO_SUBMITTED_AT": SUBMITTED, "TCO_AGENT_NAME": "review"}
    env = agent_env(environ, {"agent": {"command": ["true"]}}, read_task(environ), 8790)
    assert not [k for k in env if k.startswith("OTEL_") or k in ("TRACEPARENT", "TCO_OTEL_HEADERS_FILE")]
    assert "secret" not in repr(env)
