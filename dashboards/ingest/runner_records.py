"""The runners' JSON records in the spool (stage timestamps, metered requests) into the database.

Each record file is claimed by a rename before it is read, so two ingesters
never store one twice; a claim left by a dead ingester is taken over after
``CLAIM_STALE_S`` seconds.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Iterable

from django.conf import settings

from dashboards.core import realtime, rollups
from dashboards.ingest.accounting import check_accounting_tokens
from dashboards.models import (
    Campaign,
    Cluster,
    ModelRequest,
    Task,
)
from execution.spool.contract import TOKEN_FIELDS, RecordError, RecordVersionError, SpoolError
from execution.spool.files import JsonLinesStats, iter_json_lines, make_private_dirs
from execution.spool.layout import SpoolLayout
from execution.spool.record import RunnerRecord, parse_stage_time

log = logging.getLogger(__name__)


# --- runner records --------------------------------------------------------------------

#: Request rows kept per task (the totals count every request); ``TCO_REQUESTS_KEPT_PER_TASK`` overrides.
REQUESTS_KEPT_PER_TASK = 10_000
#: A request record (one line of ``<task>.requests.jsonl``) longer than this is skipped unread.
REQUEST_LINE_CAP_BYTES = 1 << 20
#: A claim older than this (seconds) belonged to an ingester that died: another one takes it over.
CLAIM_STALE_S = 600.0


@dataclasses.dataclass
class RunnerIngestResult:
    """What one :func:`ingest_runner_records` round did, in records (``requests_skipped``: request rows).

    ``ingested``: stored on their task and moved to ``ingested/``;
    ``waiting``: their task is not known yet, left for the next round;
    ``quarantined``: refused and moved to ``quarantine/`` (malformed, or of an
    unknown version), never stored; ``unknown_version``: how many of those
    were refused for their version alone; ``raced``: taken by another
    ingester first (not an error); ``requests_skipped``: request records not
    kept as rows (over ``TCO_REQUESTS_KEPT_PER_TASK``, or a line over
    :data:`REQUEST_LINE_CAP_BYTES`).
    """

    ingested: int = 0
    waiting: int = 0
    quarantined: int = 0
    unknown_version: int = 0
    raced: int = 0
    requests_skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a mapping (the worker task's result)."""
        return dataclasses.asdict(self)


def ingest_runner_records(cluster: Cluster, *, spool: Path | str | None = None,
                          requests_kept: int | None = None) -> RunnerIngestResult:
    """Store the stages and model requests of every runner record in the spool, then move it aside.

    Records are read through the spool contract (execution/spool/record.py,
    ``RunnerRecord``). A record joins its task by (campaign id, task number,
    job number). One that is malformed or of a version not in
    ``RECORD_VERSIONS_READ`` goes to ``<spool>/quarantine`` and is counted; one
    whose task is not known yet stays for the next round.

    Safe with several ingesters at once (workers, commands): each record is
    first claimed by an atomic rename (the loser of a race skips it), and the
    task's row is locked while its fields and requests are replaced, so a
    record stored twice (a claim taken over from a dead ingester) gives the
    same rows as once. ``<task>.requests.jsonl`` is streamed in bounded
    chunks: at most ``requests_kept`` (default ``TCO_REQUESTS_KEPT_PER_TASK``)
    rows are kept per task, the totals count every request.
    """
    layout = SpoolLayout(spool or settings.TCO_SPOOL_DIR)
    kept = requests_kept if requests_kept is not None else getattr(settings, "TCO_REQUESTS_KEPT_PER_TASK",
                                                                   REQUESTS_KEPT_PER_TASK)
    result = RunnerIngestResult()
    token = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    campaigns: set[int] = set()
    for path in layout.record_files() + layout.stale_claims(CLAIM_STALE_S):
        claim = layout.claim_name(path, token)
        try:
            os.rename(path, claim)
        except FileNotFoundError:
            result.raced += 1  # another ingester has it
            continue
        folder, name = os.path.basename(os.path.dirname(path)), layout.unclaimed_name(path)
        try:
            campaign_id = _ingest_claimed(cluster, claim, layout, kept, result)
        except RecordVersionError as exc:
            log.warning("runner record %s/%s quarantined: %s", folder, name, exc)
            result.quarantined += 1
            result.unknown_version += 1
            _move(claim, layout.quarantine_path(folder, name))
            continue
        except (RecordError, SpoolError, ValueError, KeyError, TypeError, OSError, ArithmeticError) as exc:
            log.warning("runner record %s/%s quarantined: %s", folder, name, exc)
            result.quarantined += 1
            _move(claim, layout.quarantine_path(folder, name))
            continue
        except BaseException:
            _release(claim, os.path.join(os.path.dirname(path), name))  # e.g. the database is down: retry later
            raise
        if campaign_id is None:
            result.waiting += 1
            _release(claim, os.path.join(os.path.dirname(path), name))
            continue
        result.ingested += 1
        campaigns.add(campaign_id)
        _move(claim, layout.ingested_path(folder, name))
    if result.quarantined:
        log.warning("runner records: %d quarantined (%d of an unknown version)", result.quarantined,
                    result.unknown_version)
    if campaigns:
        by_cluster: dict[str, set[int]] = {}
        for pk, name in Campaign.objects.filter(pk__in=campaigns).values_list("pk", "cluster__name"):
            by_cluster.setdefault(name, set()).add(pk)
        for name, ids in by_cluster.items():
            realtime.queue_changed(name, ids)
    return result


def _ingest_claimed(cluster: Cluster, claim: str, layout: SpoolLayout, kept: int,
                    result: RunnerIngestResult) -> int | None:
    """Store one claimed record on its task. Returns its campaign id, or None when the task is not
    known yet. Raises RecordError/RecordVersionError/ValueError/OSError for a record to quarantine."""
    record = RunnerRecord.read(claim)
    campaign_id = int(record.campaign_id)
    stages = record.stage_times()
    try:
        requests = _request_rows(record, layout, kept)
    except (ValueError, KeyError, TypeError, OSError, ArithmeticError) as exc:
        raise RecordError(f"its requests cannot be read: {exc}") from exc
    totals = requests.totals()
    totals["verdict"] = _declared_verdict(record, layout)
    data = record.to_json()
    data["ingest"] = {"requests": requests.seen, "requests_kept": len(requests.rows),
                      "requests_skipped": requests.skipped}
    # The campaign decides the cluster (one spool serves every cluster; campaign ids are tco's own).
    tasks = Task.objects.filter(campaign_id=campaign_id, task_number=record.task_number)
    if record.job_number is not None:
        tasks = tasks.filter(job_number=record.job_number)
    with rollups.deferred():  # a transaction; its rollups written last (rollups' "Lock order")
        # The row lock orders two ingesters of one task (PostgreSQL; SQLite takes its write lock
        # at BEGIN IMMEDIATE): the second one's delete sees the first one's rows.
        task_id = tasks.select_for_update().order_by("-id").values_list("id", flat=True).first()
        if task_id is None:
            return None
        with rollups.tasks_rolled([task_id]):  # its tokens, cost, verdict and requests, if it ended
            Task.objects.filter(pk=task_id).update(runner_record=data, **stages, **totals)
            ModelRequest.objects.filter(task_id=task_id).delete()
            for row in requests.rows:
                row.task_id = task_id
            ModelRequest.objects.bulk_create(requests.rows, batch_size=1000)
        check_accounting_tokens([task_id])
    if requests.skipped:
        log.warning("runner record of task %s.%s: %d request records not kept as rows", campaign_id,
                    record.task_number, requests.skipped)
    result.requests_skipped += requests.skipped
    return campaign_id


@dataclasses.dataclass
class RequestSums:
    """The request rows kept of one task and the sums over all of its requests."""

    rows: list[ModelRequest] = dataclasses.field(default_factory=list)
    seen: int = 0
    skipped: int = 0
    unreadable: int = 0
    tokens: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(TOKEN_FIELDS, 0))
    cost_usd: Decimal = Decimal(0)
    unpriced: bool = False
    flags: set[str] = dataclasses.field(default_factory=set)

    def add(self, row: ModelRequest, keep: bool) -> None:
        self.seen += 1
        for name in TOKEN_FIELDS:
            self.tokens[name] += getattr(row, name)
        if row.cost_usd is None:
            self.unpriced = self.unpriced or any(getattr(row, b) for b in TOKEN_FIELDS)
        else:
            self.cost_usd += row.cost_usd
        self.flags.update(row.flags)
        if keep:
            self.rows.append(row)
        else:
            self.skipped += 1

    def totals(self) -> dict:
        """A task's token buckets and cost: the sum over its requests.

        The cost is None (never 0) when any request with tokens has no price,
        or there was no request; the flags of every request are kept, once
        each, with ``requests_not_kept`` when rows were left out and
        ``requests_unreadable`` when a request record was too long to read
        (its tokens are then missing from the sums).
        """
        flags = set(self.flags)
        if self.skipped > self.unreadable:
            flags.add("requests_not_kept")
        if self.unreadable:
            flags.add("requests_unreadable")
        cost = None if self.unpriced or not self.seen else self.cost_usd
        return {**self.tokens, "cost_usd": cost, "usage_flags": sorted(flags)}


def _request_rows(record: RunnerRecord, layout: SpoolLayout, kept: int) -> RequestSums:
    """The metering proxy's request records of one runner record: the first ``kept`` as unsaved rows,
    the sums over all.

    Records come inline (``requests``: a list) or in a JSON-lines file inside
    the spool (``requests_path``), streamed (execution/spool/files.py
    ``iter_json_lines``), in the shape of execution/metering/proxy.py:
    ``at, method, path, status, refused, model_requested, model_returned,
    usage {provider, buckets..., complete, flags}, cost_usd (text or None),
    latency_ms, complete, flags``. A path outside the spool is refused
    (ValueError).
    """
    out = RequestSums()
    stats = JsonLinesStats()
    items: Iterable = record.requests or []
    if record.requests is None and record.requests_path:
        source = Path(record.requests_path).resolve()
        if Path(layout.root).resolve() not in source.parents:
            raise ValueError(f"requests_path {source} is outside the spool")
        items = iter_json_lines(source, max_line_bytes=REQUEST_LINE_CAP_BYTES, stats=stats)
    for seq, item in enumerate(items, start=1):
        out.add(request_row(seq, item), keep=len(out.rows) < kept)
    out.unreadable = stats.too_long
    out.skipped += stats.too_long
    return out


def request_row(seq: int, item: dict) -> ModelRequest:
    """One request record as an unsaved row. Raises KeyError/ValueError/TypeError/ArithmeticError."""
    usage = item.get("usage") or {}
    cost = item.get("cost_usd")
    flags = sorted({*(item.get("flags") or []), *(usage.get("flags") or [])})
    if item.get("refused"):
        flags.append(f"refused:{item['refused']}")
    return ModelRequest(
        seq=seq,
        at=parse_stage_time(item["at"]),
        provider=(usage.get("provider") or "")[:32],
        method=str(item.get("method") or "")[:8],
        path=str(item.get("path") or "")[:255],
        status=int(item.get("status") or 0),
        requested_model=(item.get("model_requested") or "")[:128],
        model=(item.get("model_returned") or usage.get("model") or "")[:128],
        cost_usd=Decimal(str(cost)) if cost is not None else None,
        complete=bool(item.get("complete", usage.get("complete", True))),
        latency_ms=item.get("latency_ms"),
        flags=flags,
        **{b: int(usage.get(b) or 0) for b in TOKEN_FIELDS},
    )


def _declared_verdict(record: RunnerRecord, layout: SpoolLayout) -> str:
    """The agent's verdict, when it declared a ``verdict.json`` output (``{"verdict": "..."}``).

    Read only inside the spool and only its first 64 KiB; anything else is "".
    """
    for output in record.outputs:
        if not isinstance(output, dict) or output.get("name") != "verdict.json":
            continue
        try:
            path = Path(output["path"]).resolve()
            if Path(layout.root).resolve() not in path.parents:
                return ""
            with open(path, "rb") as fh:
                verdict = json.loads(fh.read(65536)).get("verdict")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return ""
        return verdict[:64] if isinstance(verdict, str) else ""
    return ""


def _move(src: str, dst: str) -> None:
    """Move a claimed record (ours alone) to ``dst``, replacing an older one there."""
    make_private_dirs(os.path.dirname(dst))  # 0700: the submit account's alone
    os.replace(src, dst)


def _release(claim: str, original: str) -> None:
    """Give a claimed record back for the next round. If the runner wrote a newer record of the task
    meanwhile, that one stays and the claimed (older) one is dropped, as the runner's own replace would."""
    try:
        os.link(claim, original)
    except FileExistsError:
        pass
    except FileNotFoundError:
        return
    os.unlink(claim)
