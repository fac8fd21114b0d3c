"""Usage rollups kept at ingest (``UsageRollup``, issue 26): written with the detail rows, in their transaction.

Two kinds of detail feed a rollup row (``dashboards/rollup_models.py``):

* accounting records, when they are stored: ``core.bulk.store_accounting_records``
  reads the rollup groups of the records it has just inserted in the insert's
  own statement (``rollup_sql.record_select``) and adds them (:func:`records_grouped`);
  records are never changed afterwards;
* tasks of tco's campaigns, once ended (``active`` False): every write that
  ends a task or changes an ended task's usage runs inside
  :func:`tasks_rolled` (or calls :func:`tasks_added` for tasks made ended),
  which takes the tasks' share out of the rollups before and puts it back
  after, so a task moved to another hour or queue, priced, or given its
  verdict is counted once, where it now belongs.

The waste rollups (``WasteRollup``: ended tasks and their accounting records
per end state, verdict and earlier attempt) and the request rollups
(``RequestRollup``: ended tasks' model requests per provider and model) are
kept by the same hooks, and by ``core.bulk.store_accounting_records`` for
records of tco's tasks (:func:`tasks_rolled` with ``usage`` False around the
insert: a new record makes the task's earlier ones earlier attempts).

**Lock order.** Every writer adds to the same few rows (an hour of a busy
campaign), so their row locks must be taken in one order or two writers
deadlock (PostgreSQL then fails one of them: the CI run of stop 29, an ingest
batch that wrote the record hours, the day rows, then the tasks' hours again,
against a poll that wrote the hours then the days). The order: rollup rows
are a transaction's last writes, kind by kind (usage, waste, requests), the
hour rows then the day rows of each, each in key order (:func:`key_order`).
A transaction with one rollup write (one :func:`tasks_rolled` at its end)
keeps it by itself; one with several, or with writes after them, runs in
:func:`deferred`, which holds the rollup writes and makes them all at its end.

Tasks still active are not in the rollups; bills read them from the detail
rows (few: the live queue). What a row holds is written once, in SQL
(``dashboards.core.rollup_sql``), for the ingest hooks and for :func:`rebuild`
alike; the tests check the rollups against sums computed from the detail rows
in Python.

Hours are UTC hours of the usage's start (``started_at``), the instant bills
cut periods on; a bill uses the rollups where its periods start on whole
UTC hours (every zone with a whole-hour offset) and the detail rows elsewhere
(``billing.bills``).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from typing import Iterable, Iterator, Sequence

from django.db import connection, transaction

from dashboards.core.chunks import in_chunks
from dashboards.core.rollup_sql import (DAY_SPECS, SELECTS, SPECS, as_hour, day_of, days_from_hours_select,
                                       key_order, put_row, quote, record_select, task_select, upsert_sql)
from dashboards.models import AccountingRecord, Task, UsageRollup
from dashboards.rollup_models import KEY, RECORD_SUMS, REQUEST_SUMS, SUMS, TASK_SUMS, WASTE_SUMS, UsageDayRollup

log = logging.getLogger(__name__)

UTC = dt.timezone.utc


def add_records_sql(source: str, where: str = "1 = 1", grain: str = "hour") -> str:
    """The statement adding the accounting records of ``source`` (``where``) to the hour rollups
    (``grain`` "day": the day rollups); run by ``core.bulk`` over the records it has just inserted, in
    the same transaction (:func:`records_rolled_ctes`)."""
    if grain == "day":
        return upsert_sql(RECORD_SUMS, record_select(source, where, "day"), **DAY_SPECS["usage"])
    return upsert_sql(RECORD_SUMS, record_select(source, where))


def _put_groups(out: dict[tuple, list[int]], rows: Iterable[Sequence]) -> dict[tuple, list[int]]:
    """Sum ``rows`` (usage keys then sums, as ``rollup_sql.task_select`` and ``record_select`` give
    them) into ``out`` ({key: sums}); a row of NULLs (an outer join of nothing) is skipped."""
    for row in rows:
        if row[0] is None:
            continue
        key = (row[0], as_hour(row[1]), row[2], row[3], row[4])
        sums = [int(v or 0) for v in row[5:]]
        out[key] = [a + b for a, b in zip(out[key], sums)] if key in out else sums
    return out


def records_grouped(rows: Iterable[Sequence]) -> None:
    """Add record groups (rows of ``rollup_sql.record_select``, hour grain) to the rollups, hour and
    day; a row of NULLs (an outer join of no records) is skipped."""
    _add(_put_groups({}, rows), RECORD_SUMS)


def _add_records_where(where: str, params: Sequence) -> None:
    with connection.cursor() as cur:
        cur.execute(record_select(quote(AccountingRecord._meta.db_table), where), params)
        records_grouped(cur.fetchall())


def add_records_after(cluster_id: int, last_id: int) -> None:
    """Add the records of ``cluster_id`` with an id above ``last_id`` to the rollups, hour and day (the
    rows a single writer has just inserted: SQLite's write lock, ids that only grow)."""
    _add_records_where("a.cluster_id = %s AND a.id > %s", [cluster_id, last_id])


def records_added(record_ids: Iterable[int]) -> None:
    """Add accounting records stored by other means than ``core.bulk`` (tests, a repair) to the rollups."""
    for chunk in in_chunks(sorted(set(record_ids))):
        _add_records_where(f"a.id IN ({', '.join(['%s'] * len(chunk))})", chunk)


# --------------------------------------------------------------------------- tasks

def _task_groups(task_ids: Sequence[int]) -> dict[tuple, list[int]]:
    """The rollup share of the tasks ``task_ids``: {key: sums} (ended campaign tasks that started)."""
    out: dict[tuple, list[int]] = {}
    with connection.cursor() as cur:
        for chunk in in_chunks(sorted(set(task_ids))):
            cur.execute(task_select(f"t.id IN ({', '.join(['%s'] * len(chunk))})"), chunk)
            _put_groups(out, cur.fetchall())
    return out


_HELD = threading.local()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run a write whose rollup changes are made at its end, at once, in the one lock order.

    Opens a transaction (a savepoint inside the caller's). Inside it, every
    rollup write (:func:`tasks_rolled`, :func:`tasks_added`, the records
    stored by ``core.bulk``) is summed in memory, key by key, and the sums are
    written when the block ends without an error: usage, waste, then request
    rows, hours then days, each in key order. So the transaction takes its
    rollup row locks last and in the order every other writer takes them (the
    module's "Lock order"). Nested, the block is a savepoint whose held sums
    are put back as they were when it fails (a caller that catches the error
    and goes on keeps nothing of it), and the outermost block writes. A
    savepoint the caller opens inside it with ``transaction.atomic`` and rolls
    back is not seen: catch errors around a nested :func:`deferred` instead.
    """
    outer = getattr(_HELD, "sums", None)
    if outer is not None:
        kept = {kind: {key: list(values) for key, values in rows.items()} for kind, rows in outer.items()}
        try:
            with transaction.atomic():
                yield
        except BaseException:
            outer.clear()
            outer.update(kept)
            raise
        return
    held: dict[str, dict[tuple, list[int]]] = {}
    _HELD.sums = held
    try:
        with transaction.atomic():
            yield
            _HELD.sums = None
            for kind in SPECS:  # usage, waste, requests: the one order
                if held.get(kind):
                    _write(held[kind], SPECS[kind]["all_sums"], kind)
    finally:
        _HELD.sums = None


def _add(groups: dict[tuple, list[int]], sums: Sequence[str], *, kind: str = "usage") -> None:
    """Add ``groups`` ({key: sums}, hour keys) to the rollups of ``kind`` (usage, waste or requests):
    now, or at the end of the :func:`deferred` block it runs in."""
    held = getattr(_HELD, "sums", None)
    if held is None:
        _write(groups, sums, kind)
        return
    all_sums = SPECS[kind]["all_sums"]
    at = [all_sums.index(s) for s in sums]
    into = held.setdefault(kind, {})
    for key, values in groups.items():
        row = into.setdefault(key, [0] * len(all_sums))
        for i, value in zip(at, values):
            row[i] += value


def _write(groups: dict[tuple, list[int]], sums: Sequence[str], kind: str) -> None:
    """Write ``groups`` to the rollups of ``kind``, then the same to their days (usage and waste:
    ``DAY_SPECS``): hours then days, each in key order (the module's "Lock order")."""
    grains = [(groups, SPECS[kind])]
    if kind in DAY_SPECS:
        days: dict[tuple, list[int]] = {}
        for key, values in groups.items():
            day_key = (key[0], day_of(key[1]), *key[2:])
            days[day_key] = [a + b for a, b in zip(days[day_key], values)] if day_key in days else list(values)
        grains.append((days, DAY_SPECS[kind]))
    for found, spec in grains:
        rows = [[key[0], connection.ops.adapt_datetimefield_value(key[1]), *key[2:], *values]
                for key, values in sorted(found.items(), key=lambda kv: key_order(kv[0])) if any(values)]
        if rows:
            with connection.cursor() as cur:
                cur.executemany(upsert_sql(sums, **spec), rows)


def _delta(before: dict[tuple, list[int]], after: dict[tuple, list[int]]) -> dict[tuple, list[int]]:
    """after - before, key by key."""
    delta = {}
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if old is None:
            delta[key] = new
        elif new is None:
            delta[key] = [-v for v in old]
        else:
            delta[key] = [b - a for a, b in zip(old, new)]
    return delta


class TaskRoll:
    """The tasks one write changes (:func:`tasks_rolled`); ``include`` adds tasks made inside it."""

    def __init__(self, task_ids: Iterable[int]) -> None:
        self.ids = set(task_ids)
        self.before: dict[tuple, list[int]] = {}

    def include(self, task_ids: Iterable[int]) -> None:
        """Tasks created (or first touched) inside the block: their share before it was nothing."""
        self.ids.update(i for i in task_ids if i is not None)


@contextlib.contextmanager
def tasks_rolled(task_ids: Iterable[int] = (), *, usage: bool = True) -> Iterator[TaskRoll]:
    """Run a write that changes the tasks ``task_ids`` and keep the rollups equal to them.

    Opens a transaction (a savepoint inside the caller's), locks the tasks'
    rows (PostgreSQL; SQLite holds its write lock), reads their share of the
    rollups, runs the block, reads it again and writes the difference. A task
    that ends, moves to another hour or queue, or gets tokens, a cost or a
    verdict is thereby counted once, where it now belongs. The usage rollups,
    the waste rollups (which also hold the tasks' accounting records by end
    state, verdict and attempt) and the request rollups (the tasks' model
    requests: store them inside the block); ``usage`` False: not the usage
    rollups (records stored for the tasks: their usage share is added from the
    insert's own statement, :func:`records_grouped`).
    """
    roll = TaskRoll(task_ids)
    with transaction.atomic():
        if roll.ids and connection.vendor == "postgresql":
            with connection.cursor() as cur:
                for chunk in in_chunks(sorted(roll.ids)):
                    cur.execute(f"SELECT id FROM {quote(Task._meta.db_table)} WHERE id IN "
                                f"({', '.join(['%s'] * len(chunk))}) ORDER BY id FOR UPDATE", chunk)
        kinds = ("usage", "waste", "requests") if usage else ("waste", "requests")
        before = {k: _shares(k, sorted(roll.ids)) if roll.ids else {} for k in kinds}
        yield roll
        for k in kinds:
            after = _shares(k, sorted(roll.ids)) if roll.ids else {}
            _add(_delta(before[k], after), TASK_SUMS if k == "usage" else SPECS[k]["all_sums"], kind=k)


def tasks_added(task_ids: Iterable[int]) -> None:
    """Add tasks that were just made (ended ones, e.g. from an accounting record of a task no poll saw)."""
    ids = [i for i in task_ids if i is not None]
    if ids:
        _add(_task_groups(ids), TASK_SUMS)
        _add(_waste_groups(ids), WASTE_SUMS, kind="waste")
        _add(_request_groups(ids), REQUEST_SUMS, kind="requests")


# --------------------------------------------------------------------------- waste and requests

def _shares(kind: str, task_ids: Sequence[int]) -> dict[tuple, list[int]]:
    return _task_groups(task_ids) if kind == "usage" else _groups(kind, task_ids)


def _groups(kind: str, task_ids: Sequence[int]) -> dict[tuple, list[int]]:
    """The share of the tasks ``task_ids`` in the ``kind`` rollups (waste, requests): {key: sums}."""
    out: dict[tuple, list[int]] = {}
    width = len(SPECS[kind]["key"])
    with connection.cursor() as cur:
        for chunk in in_chunks(sorted(set(task_ids))):
            where = f"t.id IN ({', '.join(['%s'] * len(chunk))})"
            for select, sums, _on_records in SELECTS[kind]:
                cur.execute(select(where), chunk)
                for row in cur.fetchall():
                    put_row(out, row, SPECS[kind]["all_sums"].index(sums[0]), kind, width)
    return out


def _waste_groups(task_ids: Sequence[int]) -> dict[tuple, list[int]]:
    return _groups("waste", task_ids)


def _request_groups(task_ids: Sequence[int]) -> dict[tuple, list[int]]:
    return _groups("requests", task_ids)


# --------------------------------------------------------------------------- rebuild and check

def rebuild(*, cluster_id: int | None = None, since: dt.datetime | None = None) -> int:
    """Make the rollups again from the detail rows (a migration's backfill, ``tco_rollups --rebuild``).

    With ``since`` (a whole UTC hour) only the hours from ``since`` on are
    made again: the detail rows before a retention cut are gone, and the
    rollups are then all that is left of them. Returns the rollup rows written.
    """
    table = quote(UsageRollup._meta.db_table)
    (where, task_where, record_where), params = _where(cluster_id, since)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"DELETE FROM {table} WHERE {where}", params)
        cur.execute(upsert_sql(TASK_SUMS, task_select(task_where)), params)
        cur.execute(add_records_sql(quote(AccountingRecord._meta.db_table), record_where), params)
        if _day_grain_made():
            rebuild_days("usage", cluster_id=cluster_id, since=since)
        return _stored(cluster_id, since).count()


def _rebuild_kind(kind: str, cluster_id: int | None, since: dt.datetime | None) -> int:
    spec = SPECS[kind]
    table = quote(spec["model"]._meta.db_table)
    (where, task_where, record_where), params = _where(cluster_id, since)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"DELETE FROM {table} WHERE {where}", params)
        for select, sums, on_records in SELECTS[kind]:
            cur.execute(upsert_sql(sums, select(record_where if on_records else task_where), **spec), params)
        if kind in DAY_SPECS and _day_grain_made():
            rebuild_days(kind, cluster_id=cluster_id, since=since)
    return _stored(cluster_id, since, spec["model"]).count()


def rebuild_waste(*, cluster_id: int | None = None, since: dt.datetime | None = None) -> int:
    """Make the waste rollups again from the detail rows (migration 0022's backfill, ``tco_rollups
    --rebuild``); ``since`` as for :func:`rebuild`. Returns the waste rollup rows written."""
    return _rebuild_kind("waste", cluster_id, since)


def rebuild_requests(*, cluster_id: int | None = None, since: dt.datetime | None = None) -> int:
    """Make the request rollups again from the detail rows (as :func:`rebuild_waste`); returns their rows."""
    return _rebuild_kind("requests", cluster_id, since)


def kind_differences(kind: str, *, cluster_id: int | None = None, since: dt.datetime | None = None) -> list[dict]:
    """Where the ``kind`` rollups (waste, requests) differ from the detail rows: ``[{"key", "rollup",
    "detail"}]``."""
    spec = SPECS[kind]
    width = len(spec["key"])
    (_where_rollup, task_where, record_where), params = _where(cluster_id, since)
    detail: dict[tuple, list[int]] = {}
    with connection.cursor() as cur:
        for select, sums, on_records in SELECTS[kind]:
            cur.execute(select(record_where if on_records else task_where), params)
            for row in cur.fetchall():
                put_row(detail, row, spec["all_sums"].index(sums[0]), kind, width)
    stored: dict[tuple, list[int]] = {}
    for row in _stored(cluster_id, since, spec["model"]).values_list(*spec["key"], *spec["all_sums"]):
        put_row(stored, row, 0, kind, width)
    zero = [0] * len(spec["all_sums"])
    out = []
    for key in sorted(detail.keys() | stored.keys(), key=str):
        a, b = stored.get(key, zero), detail.get(key, zero)
        if a != b:
            out.append({"key": dict(zip(spec["key"], key)), "rollup": dict(zip(spec["all_sums"], a)),
                        "detail": dict(zip(spec["all_sums"], b))})
    return out


def waste_differences(*, cluster_id: int | None = None, since: dt.datetime | None = None) -> list[dict]:
    """Where the waste rollups differ from the detail rows (:func:`kind_differences`)."""
    return kind_differences("waste", cluster_id=cluster_id, since=since)


def _where(cluster_id: int | None, since: dt.datetime | None) -> tuple[tuple[str, str, str], list]:
    """``WHERE`` clauses for the rollups, the tasks (``t``) and the records (``a``) of one cluster (or
    all) from ``since`` on (or ever), and their one list of parameters."""
    rollup, task, record, params = ["1 = 1"], ["1 = 1"], ["1 = 1"], []
    if cluster_id is not None:
        rollup.append("cluster_id = %s")
        task.append("t.cluster_id = %s")
        record.append("a.cluster_id = %s")
        params.append(cluster_id)
    if since is not None:
        rollup.append("hour >= %s")
        task.append("t.started_at >= %s")
        record.append("a.started_at >= %s")
        params.append(connection.ops.adapt_datetimefield_value(since))
    return (" AND ".join(rollup), " AND ".join(task), " AND ".join(record)), params


def _stored(cluster_id: int | None, since: dt.datetime | None, model=UsageRollup):
    rows = model.objects.all()
    if cluster_id is not None:
        rows = rows.filter(cluster_id=cluster_id)
    if since is not None:
        rows = rows.filter(hour__gte=since)
    return rows


def differences(*, cluster_id: int | None = None, since: dt.datetime | None = None) -> list[dict]:
    """Where the rollups differ from the detail rows (``tco_rollups --check``): ``[{"key", "rollup",
    "detail"}]``, each a {sum: value}; [] when they agree."""
    detail: dict[tuple, list[int]] = {}
    (_rollup_where, task_where, record_where), params = _where(cluster_id, since)
    zero = [0] * len(SUMS)
    with connection.cursor() as cur:
        cur.execute(task_select(task_where), params)
        for row in cur.fetchall():
            key = (row[0], as_hour(row[1]), row[2], row[3], row[4])
            detail.setdefault(key, list(zero))[:len(TASK_SUMS)] = [int(v or 0) for v in row[5:]]
        cur.execute(record_select(quote(AccountingRecord._meta.db_table), record_where), params)
        for row in cur.fetchall():
            key = (row[0], as_hour(row[1]), row[2], row[3], row[4])
            detail.setdefault(key, list(zero))[len(TASK_SUMS):] = [int(v or 0) for v in row[5:]]
    stored: dict[tuple, list[int]] = {}
    for row in _stored(cluster_id, since).values_list(*KEY, *SUMS):
        key = (row[0], row[1].astimezone(UTC), row[2], row[3], row[4])
        stored[key] = [a + b for a, b in zip(stored.get(key, zero), row[5:])]
    out = []
    for key in sorted(detail.keys() | stored.keys(), key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
        a, b = stored.get(key, zero), detail.get(key, zero)
        if a != b:
            out.append({"key": dict(zip(KEY, key)), "rollup": dict(zip(SUMS, a)), "detail": dict(zip(SUMS, b))})
    return out


# --------------------------------------------------------------------------- the day grain

def _day_grain_made() -> bool:
    """Whether the day rollups' tables exist (migration 0023): the backfills of 0021 and 0022 run
    :func:`rebuild` before they do."""
    return UsageDayRollup._meta.db_table in connection.introspection.table_names()


def _day_where(cluster_id: int | None, since: dt.datetime | None, column: str) -> tuple[str, list]:
    where, params = ["1 = 1"], []
    if cluster_id is not None:
        where.append("cluster_id = %s")
        params.append(cluster_id)
    if since is not None:
        where.append(f"{column} >= %s")
        params.append(connection.ops.adapt_datetimefield_value(day_of(since)))
    return " AND ".join(where), params


def rebuild_days(kind: str = "usage", *, cluster_id: int | None = None, since: dt.datetime | None = None) -> int:
    """Make the day rows of ``kind`` (usage, waste) again from its hour rows (migration 0023's
    backfill; :func:`rebuild` and :func:`rebuild_waste` call it): the days from the one of ``since``
    on (every hour row of that day is summed, those before ``since`` too), or all. The hour rows are
    kept for every hour, retained detail or not, so the day rows are exact wherever the hours are.
    Returns the day rows of ``kind`` from that day on."""
    spec = DAY_SPECS[kind]
    table = quote(spec["model"]._meta.db_table)
    day_where, day_params = _day_where(cluster_id, since, "day")
    hour_where, hour_params = _day_where(cluster_id, since, "hour")
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"DELETE FROM {table} WHERE {day_where}", day_params)
        cur.execute(upsert_sql(spec["all_sums"], days_from_hours_select(kind, hour_where), **spec), hour_params)
        cur.execute(f"SELECT COUNT(*) FROM {table} WHERE {day_where}", day_params)
        return cur.fetchone()[0]


def day_differences(kind: str = "usage", *, cluster_id: int | None = None) -> list[dict]:
    """Where the day rows of ``kind`` (usage, waste) differ from the sum of their hour rows:
    ``[{"key", "day", "hours"}]`` (each a {sum: value}); [] when they agree."""
    spec = DAY_SPECS[kind]
    where, params = _day_where(cluster_id, None, "day")
    width = len(spec["key"])
    from_hours: dict[tuple, list[int]] = {}
    stored: dict[tuple, list[int]] = {}
    with connection.cursor() as cur:
        cur.execute(days_from_hours_select(kind, where), params)
        for row in cur.fetchall():
            from_hours[(row[0], as_hour(row[1]), *row[2:width])] = [int(v or 0) for v in row[width:]]
        cur.execute(f"SELECT {', '.join(quote(c) for c in (*spec['key'], *spec['all_sums']))} "
                    f"FROM {quote(spec['model']._meta.db_table)} WHERE {where}", params)
        for row in cur.fetchall():
            stored[(row[0], as_hour(row[1]), *row[2:width])] = [int(v or 0) for v in row[width:]]
    zero = [0] * len(spec["all_sums"])
    out = []
    for key in sorted(from_hours.keys() | stored.keys(), key=key_order):
        a, b = stored.get(key, zero), from_hours.get(key, zero)
        if a != b:
            out.append({"key": dict(zip(spec["key"], key)), "day": dict(zip(spec["all_sums"], a)),
                        "hours": dict(zip(spec["all_sums"], b))})
    return out
