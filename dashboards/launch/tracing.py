"""The trace context a campaign's tasks carry (issue 25, docs/otel.md).

With an OTLP endpoint in the workers' environment (``settings.TCO_OTEL_ENV``), every
submission gives its array job a new W3C ``TRACEPARENT`` (one trace per campaign), the
submission time (``TCO_SUBMITTED_AT``, where queue wait starts), the agent's name and the
``OTEL_*`` variables; headers (which may hold a receiver's key) go to a private file in the
spool (``otel-headers``, 0600) named by ``TCO_OTEL_HEADERS_FILE``, never to the job's
environment (``qstat -j`` shows it). After the scheduler took the job, the launch's own span
(the trace's root, ``launch campaign <id>``) is exported in a thread of its own.
"""
from __future__ import annotations

import datetime as dt
import os
import threading

from django.conf import settings

from dashboards.launch.spool import spool_dir
from dashboards.models import Campaign
from execution.metering.otel import export_launch_span, tracing_configured
from execution.metering.otel_spans import TraceParent
from execution.spool.files import write_atomic

HEADERS_FILE = "otel-headers"


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def trace_environment(campaign: Campaign, now: dt.datetime | None = None) -> dict[str, str]:
    """The job environment's tracing part for one submission of ``campaign``: ``{}`` when tracing is
    off; else the ``OTEL_*`` variables, ``TRACEPARENT`` (new), ``TCO_SUBMITTED_AT`` (``now``, ISO UTC),
    ``TCO_AGENT_NAME`` and ``TCO_OTEL_HEADERS_FILE`` when headers are set (the file is written here).
    Raises OSError when the headers file cannot be written."""
    env = dict(getattr(settings, "TCO_OTEL_ENV", {}) or {})
    if not tracing_configured(env):
        return {}
    env["TRACEPARENT"] = TraceParent.new().text()
    env["TCO_SUBMITTED_AT"] = _iso(now or dt.datetime.now(dt.timezone.utc))
    env["TCO_AGENT_NAME"] = campaign.agent_definition.name[:200]
    headers = getattr(settings, "TCO_OTEL_HEADERS", "")
    if headers:
        path = os.path.join(spool_dir(), HEADERS_FILE)
        write_atomic(path, headers.encode("utf-8"), mode=0o600)
        env["TCO_OTEL_HEADERS_FILE"] = path
    return env


def export_launch(campaign: Campaign, environment: dict[str, str], job_number: int) -> threading.Thread | None:
    """Export the launch's span (``launch campaign <id>``: launch accepted -> the submission, with
    ``tco.campaign.id``, ``tco.job.number``, ``tco.task_count``, ``gen_ai.agent.name``) in a daemon
    thread, so a slow receiver never holds the submission; the thread, or None when tracing is off."""
    parent = TraceParent.parse(environment.get("TRACEPARENT"))
    if parent is None:
        return None
    start = _iso(campaign.launched_at) if campaign.launched_at else environment["TCO_SUBMITTED_AT"]
    attributes = {"tco.campaign.id": str(campaign.pk), "tco.job.number": int(job_number),
                  "tco.task_count": int(campaign.task_count), "gen_ai.agent.name": environment["TCO_AGENT_NAME"],
                  "tco.queue": campaign.queue}
    thread = threading.Thread(target=export_launch_span, name="tco-otel-launch", daemon=True,
                              args=(environment, parent),
                              kwargs={"name": f"launch campaign {campaign.pk}", "start_at": start,
                                      "end_at": _iso(dt.datetime.now(dt.timezone.utc)), "attributes": attributes})
    thread.start()
    return thread
