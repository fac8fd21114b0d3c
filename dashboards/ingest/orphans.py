"""Tasks whose runner was killed outright (SIGKILL): no runner record, but what it metered is on disk.

A runner stopped by a signal it can catch (qdel with ``-notify``, a soft
limit) writes its record with the stages it reached (execution/runner/).
SIGKILL cannot be caught: the runner dies without a record, but the metering
proxy had appended each request to ``records/<campaign>/<task>.requests.jsonl``
as it was metered. :func:`recover_killed_runners` finds tasks that have ended
(their accounting record is read: ``failed``, exit 137 for a SIGKILL) with no
runner record ``TCO_RUNNER_RECORD_GRACE_S`` seconds after their end, and
stores

* the usage metered: the request rows and token/cost totals from that file
  (the same rows as a runner record's, dashboards/ingest.py), a last line cut
  by the kill being left out (flag ``requests_unreadable``);
* the stages it reached that are known without the runner: ``task_started_at``
  is the accounting record's start (the shepherd started the runner then);
  the later stages stay empty (unknown, never guessed);
* the flag ``runner_record_missing`` (the task is then left alone by later rounds).

Tasks that ended more than two days ago are not looked at (a bounded scan).

A runner record that still arrives later replaces all of this (ingest
overwrites the task's fields and rows).
"""
from __future__ import annotations

import datetime as dt
import json
import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboards.core import realtime, rollups
from dashboards.ingest import runner_records
from dashboards.models import Cluster, ModelRequest, Task
from execution.spool.layout import SpoolLayout

log = logging.getLogger(__name__)

#: Seconds after a task's end before a missing runner record is taken as "the runner was killed".
RUNNER_RECORD_GRACE_S = 60.0
FLAG = "runner_record_missing"


def recover_killed_runners(cluster: Cluster, *, now: dt.datetime | None = None, spool=None,
                           limit: int = 200) -> int:
    """Store the metered usage and known stages of ended campaign tasks that have no runner record.

    Returns how many tasks were recovered. Only ``failed`` tasks are
    considered (a runner killed outright never ends ``done``). Raises nothing
    for an unreadable requests file: its rows are skipped and flagged.
    """
    now = now or timezone.now()
    grace = getattr(settings, "TCO_RUNNER_RECORD_GRACE_S", RUNNER_RECORD_GRACE_S)
    layout = SpoolLayout(spool or settings.TCO_SPOOL_DIR)
    kept = getattr(settings, "TCO_REQUESTS_KEPT_PER_TASK", runner_records.REQUESTS_KEPT_PER_TASK)
    candidates = [
        t for t in Task.objects.filter(cluster=cluster, active=False, state="failed", campaign__isnull=False,
                                       runner_record__isnull=True, ended_at__lt=now - dt.timedelta(seconds=grace),
                                       ended_at__gt=now - dt.timedelta(days=2)).order_by("ended_at")
        if FLAG not in (t.usage_flags or [])
    ][:limit]
    campaigns: set[int] = set()
    recovered = 0
    for task in candidates:
        requests = _metered(layout.task_file(task.campaign_id, task.task_number, "requests.jsonl"), kept)
        totals = requests.totals()
        totals["usage_flags"] = sorted({*totals["usage_flags"], FLAG})
        with transaction.atomic():
            with rollups.tasks_rolled([task.pk]):  # its metered usage and requests join the rollups
                updated = Task.objects.filter(pk=task.pk, runner_record__isnull=True).update(
                    task_started_at=task.task_started_at or task.started_at, **totals)
                if updated:
                    ModelRequest.objects.filter(task_id=task.pk).delete()
                    for row in requests.rows:
                        row.task_id = task.pk
                    ModelRequest.objects.bulk_create(requests.rows, batch_size=1000)
            if not updated:
                continue  # its record arrived meanwhile
        recovered += 1
        campaigns.add(task.campaign_id)
        log.warning("task %s.%s ended with no runner record (killed outright): %d metered requests stored",
                    task.campaign_id, task.task_number, requests.seen)
    if campaigns:
        realtime.queue_changed(cluster.name, campaigns)
    return recovered


def _metered(path: str, kept: int) -> "runner_records.RequestSums":
    """The request rows (first ``kept``) and sums of a requests file, as dashboards/ingest.py makes them.

    Lines are read one by one; a last line without its newline (cut by the
    kill) or a line that is not a request record is left out and flagged
    ``requests_unreadable``. A missing file is no requests.
    """
    out = runner_records.RequestSums()
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return out
    with fh:
        for seq, line in enumerate(fh, start=1):
            if not line.endswith(b"\n") or len(line) > runner_records.REQUEST_LINE_CAP_BYTES:
                out.flags.add("requests_unreadable")
                continue
            if not line.strip():
                continue
            try:
                row = runner_records.request_row(seq, json.loads(line))
            except (ValueError, KeyError, TypeError, ArithmeticError):
                out.flags.add("requests_unreadable")
                continue
            out.add(row, keep=len(out.rows) < kept)
    return out
