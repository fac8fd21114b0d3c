"""What a rollup row holds, written once in SQL (issue 26): the selects that group detail rows by a
rollup's key, the upsert that adds groups to the rollup rows, and what each kind of rollup is made of.

``dashboards.core.rollups`` runs these: at ingest (its hooks, in the detail rows' transaction), and
to rebuild or check the rollups from the detail rows. The selects are
:func:`task_select` and :func:`record_select` (``UsageRollup``), :func:`waste_task_select` and
:func:`waste_record_select` (``WasteRollup``), :func:`request_select` (``RequestRollup``) and
:func:`days_from_hours_select` (the day grain from the hour rows). Each returns SQL with ``%s``
parameters (``%`` written twice), for SQLite or PostgreSQL as the connection is. Sums are integers:
costs in 1e-8 USD (:data:`COST_UNITS`), wall clock in microseconds; hours are UTC hours of the
usage's start (``started_at``).
"""
from __future__ import annotations

import datetime as dt
from typing import Sequence

from django.db import connection

from dashboards.core.failures import infrastructure_sql
from dashboards.models import AccountingRecord, ModelRequest, RequestRollup, Task, UsageRollup, WasteRollup
from dashboards.rollup_models import (DAY_KEY, KEY, REQUEST_KEY, REQUEST_SUMS, SUMS, WASTE_DAY_KEY, WASTE_KEY,
                                     WASTE_RECORD_SUMS, WASTE_SUMS, WASTE_TASK_SUMS, UsageDayRollup,
                                     WasteDayRollup)

UTC = dt.timezone.utc
#: Costs are integers of 1e-8 USD (``Task.cost_usd`` has 8 decimals).
COST_UNITS = 100_000_000
#: The disjoint token buckets (DESIGN.md); a task with tokens in any of them and no cost is unpriced.
BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens")


def quote(name: str) -> str:
    """``name`` (a table or column) quoted for the connection's database."""
    return connection.ops.quote_name(name)


def hour_sql(column: str, grain: str = "hour") -> str:
    """SQL for the start of the UTC hour (``grain`` "day": the UTC day) of a datetime column, as the
    column's own type stores it."""
    if connection.vendor == "postgresql":
        return f"date_trunc('{grain}', {column} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    # SQLite: Django stores UTC datetimes as text 'YYYY-MM-DD HH:MM:SS[.ffffff]'.
    # (``%%``: every statement here is run with parameters, where ``%`` is written twice.)
    return f"strftime('%%Y-%%m-%%d {'00' if grain == 'day' else '%%H'}:00:00', {column})"


def bigint_sql(expr: str) -> str:
    """SQL casting ``expr`` to a 64-bit integer."""
    return f"CAST({expr} AS BIGINT)" if connection.vendor == "postgresql" else f"CAST({expr} AS INTEGER)"


def task_select(where: str) -> str:
    """One group per rollup key of the ended campaign tasks ``where`` selects (alias ``t``): the key
    columns then :data:`TASK_SUMS`, each as a bill counts it (``billing.bills``)."""
    any_tokens = " OR ".join(f"t.{quote(b)} > 0" for b in BUCKETS)
    return (
        f"SELECT t.cluster_id, {hour_sql('t.started_at')} AS h, t.campaign_id, '' AS p, t.{quote('queue')} AS qu, "
        f"COUNT(*), "
        f"SUM(CASE WHEN t.state IN ('done', 'failed') THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN t.state = 'done' AND t.verdict <> '' THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN t.cost_usd IS NULL AND ({any_tokens}) THEN 1 ELSE 0 END), "
        f"COALESCE(SUM({bigint_sql(f'ROUND(t.cost_usd * {COST_UNITS})')}), 0), "
        + ", ".join(f"SUM(t.{quote(b)})" for b in (*BUCKETS, "reasoning_tokens"))
        + f" FROM {quote(Task._meta.db_table)} t"
        f" WHERE t.active = {false_sql()} AND t.campaign_id IS NOT NULL AND t.started_at IS NOT NULL AND ({where})"
        f" GROUP BY t.cluster_id, {hour_sql('t.started_at')}, t.campaign_id, t.{quote('queue')}"
    )


def false_sql() -> str:
    """SQL for false as a boolean column compares to it."""
    return "false" if connection.vendor == "postgresql" else "0"


def record_select(source: str, where: str = "1 = 1", grain: str = "hour") -> str:
    """One group per rollup key of the accounting records in ``source`` (a table or a CTE with the
    record's columns, alias ``a``) that ``where`` selects: the key columns then :data:`RECORD_SUMS`.
    A record of a tco campaign's task is that campaign's; any other keeps its own project. ``grain``
    "day": per UTC day (``UsageDayRollup``). In key order: every writer locks rollup rows in one
    order, so two writers of the same rows wait for each other, never deadlock."""
    wall = bigint_sql("ROUND(a.wallclock_s * 1000000)")
    project, queue = "CASE WHEN t.campaign_id IS NULL THEN a.project ELSE '' END", f"a.{quote('queue')}"
    return (
        f"SELECT a.cluster_id, {hour_sql('a.started_at', grain)} AS h, COALESCE(t.campaign_id, 0), "
        f"{project}, {queue}, "
        f"COUNT(*), SUM({wall}), SUM({wall} * a.slots)"
        f" FROM {source} a LEFT JOIN {quote(Task._meta.db_table)} t ON t.id = a.task_id"
        f" WHERE a.started_at IS NOT NULL AND ({where})"
        f" GROUP BY a.cluster_id, {hour_sql('a.started_at', grain)}, COALESCE(t.campaign_id, 0), {project}, {queue}"
        f" ORDER BY 1, 2, 3, {text_order(project)}, {text_order(queue)}"
    )


def text_order(expr: str) -> str:
    """``expr`` (text) as ORDER BY sorts it in code point order, as Python sorts keys (:func:`key_order`)."""
    return f'{expr} COLLATE "C"' if connection.vendor == "postgresql" else expr


def upsert_sql(sums: Sequence[str], select: str | None = None, *, model=UsageRollup,
                key: Sequence[str] = KEY, all_sums: Sequence[str] = SUMS) -> str:
    """``INSERT`` of rollup rows of ``model`` (``key``, ``sums``) adding to a row of the same key:
    from ``select``, or from one row of parameters."""
    table = quote(model._meta.db_table)
    columns = [*key, *sums]
    # The columns not written take 0 (a new row), as the model's defaults say.
    others = [s for s in all_sums if s not in sums]
    insert_cols = ", ".join(quote(c) for c in (*columns, *others))
    zeros = ", 0" * len(others)
    if select is None:
        source = f"VALUES ({', '.join(['%s'] * len(columns))}{zeros})"
    else:
        source = f"SELECT *{zeros} FROM ({select}) AS g"
        if connection.vendor == "sqlite":
            source += " WHERE true"  # SQLite: an upsert's SELECT needs a WHERE clause to parse
    add = ", ".join(f"{quote(s)} = {table}.{quote(s)} + excluded.{quote(s)}" for s in sums)
    return (f"INSERT INTO {table} ({insert_cols}) {source} "
            f"ON CONFLICT ({', '.join(quote(c) for c in key)}) DO UPDATE SET {add}")


def as_hour(value) -> dt.datetime:
    """A rollup key's hour (or day) as the database answers it (SQLite: text) as an aware UTC datetime."""
    if isinstance(value, str):  # SQLite's text
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def day_of(hour: dt.datetime) -> dt.datetime:
    """00:00 UTC of the day of ``hour`` (an aware UTC datetime)."""
    return hour.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def key_order(key: tuple) -> tuple:
    """A rollup key as it sorts in the database's key order (False before True, text as text)."""
    return tuple((0, v) if isinstance(v, (int, bool)) else (1, v) if isinstance(v, dt.datetime) else (2, str(v))
                 for v in key)


def verdict_sql(alias: str) -> str:
    """SQL for the verdict a waste rollup keeps: the task's where it ended done, else ""."""
    return f"CASE WHEN {alias}.state = 'done' THEN {alias}.verdict ELSE '' END"


def waste_task_select(where: str) -> str:
    """One group per waste key of the ended campaign tasks ``where`` selects (alias ``t``), by
    their start: the key columns (``infrastructure``: ``core.failures.infrastructure_sql``) then
    :data:`WASTE_TASK_SUMS` (``billing.waste``'s sums)."""
    any_tokens = " OR ".join(f"t.{quote(b)} > 0" for b in BUCKETS)
    return (
        f"SELECT t.cluster_id, {hour_sql('t.started_at')} AS h, t.campaign_id, t.state, {verdict_sql('t')} AS v, "
        f"{infrastructure_sql('t')} AS f, {false_sql()} AS e, COUNT(*), "
        f"SUM(CASE WHEN t.cost_usd IS NULL AND ({any_tokens}) THEN 1 ELSE 0 END), "
        f"COALESCE(SUM({bigint_sql(f'ROUND(t.cost_usd * {COST_UNITS})')}), 0)"
        f" FROM {quote(Task._meta.db_table)} t"
        f" WHERE t.active = {false_sql()} AND t.campaign_id IS NOT NULL AND t.started_at IS NOT NULL AND ({where})"
        f" GROUP BY 1, 2, 3, 4, 5, 6"
    )


def waste_record_select(where: str) -> str:
    """One group per waste key of the accounting records of the ended campaign tasks ``where``
    selects (records ``a``, tasks ``t``), by each record's start: the key columns (``infrastructure``:
    the task's, as :func:`waste_task_select` has it; ``earlier``: a later record of the same task exists)
    then :data:`WASTE_RECORD_SUMS`."""
    records = quote(AccountingRecord._meta.db_table)
    wall = bigint_sql("ROUND(a.wallclock_s * 1000000)")
    inner = (
        f"SELECT a.cluster_id AS c, {hour_sql('a.started_at')} AS h, t.campaign_id AS k, t.state AS s, "
        f"{verdict_sql('t')} AS v, {infrastructure_sql('t')} AS f, CASE WHEN EXISTS (SELECT 1 FROM {records} b "
        f"WHERE b.task_id = a.task_id AND b.start_us > a.start_us) THEN 1 ELSE 0 END AS e, {wall} AS w, a.slots AS n"
        f" FROM {records} a JOIN {quote(Task._meta.db_table)} t ON t.id = a.task_id"
        f" WHERE t.active = {false_sql()} AND t.campaign_id IS NOT NULL AND a.started_at IS NOT NULL AND ({where})"
    )
    earlier = "x.e = 1" if connection.vendor == "postgresql" else "x.e"
    return (f"SELECT x.c, x.h, x.k, x.s, x.v, x.f, {earlier}, COUNT(*), SUM(x.w), SUM(x.w * x.n) FROM ({inner}) x"
            f" GROUP BY x.c, x.h, x.k, x.s, x.v, x.f, x.e")


def request_select(where: str) -> str:
    """One group per request rollup key of the model requests of the ended campaign tasks ``where``
    selects (tasks ``t``, requests ``r``), by the task's start: the key columns, then the requests."""
    return (
        f"SELECT t.cluster_id, {hour_sql('t.started_at')} AS h, t.campaign_id, r.provider, r.{quote('model')}, COUNT(*)"
        f" FROM {quote(ModelRequest._meta.db_table)} r JOIN {quote(Task._meta.db_table)} t ON t.id = r.task_id"
        f" WHERE t.active = {false_sql()} AND t.campaign_id IS NOT NULL AND t.started_at IS NOT NULL AND ({where})"
        f" GROUP BY 1, 2, 3, 4, 5"
    )


#: What each kind of rollup kept by task is made of: its model, key and sums (for the upsert).
SPECS = {
    "usage": {"model": UsageRollup, "key": KEY, "all_sums": SUMS},
    "waste": {"model": WasteRollup, "key": WASTE_KEY, "all_sums": WASTE_SUMS},
    "requests": {"model": RequestRollup, "key": REQUEST_KEY, "all_sums": REQUEST_SUMS},
}
#: The day grain of the usage and waste rollups (``rollup_models``: ``UsageDayRollup``, ``WasteDayRollup``):
#: the same sums, keyed by the UTC day where the hour rows have the hour.
DAY_SPECS = {
    "usage": {"model": UsageDayRollup, "key": DAY_KEY, "all_sums": SUMS},
    "waste": {"model": WasteDayRollup, "key": WASTE_DAY_KEY, "all_sums": WASTE_SUMS},
}
#: The selects of the waste and request rollups, each with the sums it gives and whether its ``where``
#: is on the records (a) or the tasks (t).
SELECTS = {
    "waste": ((waste_task_select, WASTE_TASK_SUMS, False), (waste_record_select, WASTE_RECORD_SUMS, True)),
    "requests": ((request_select, REQUEST_SUMS, False),),
}


def put_row(out: dict[tuple, list[int]], row: Sequence, at: int, kind: str = "waste",
            width: int = len(WASTE_KEY)) -> None:
    """Add one select's row (the key's ``width`` columns, then sums that start at ``at`` in the
    ``kind``'s sums) to ``out``. (SQLite's 0 and 1 for ``earlier`` equal False and True as keys.)"""
    key = (row[0], as_hour(row[1]), *row[2:width])
    sums = out.setdefault(key, [0] * len(SPECS[kind]["all_sums"]))
    for i, value in enumerate(row[width:]):
        sums[at + i] += int(value or 0)


def days_from_hours_select(kind: str, where: str) -> str:
    """The day rows of ``kind`` (usage, waste) summed from its hour rows ``where`` selects: the day
    key's columns then every sum, in key order."""
    spec, day = SPECS[kind], DAY_SPECS[kind]
    rest = [quote(c) for c in spec["key"][2:]]
    texts = {"project", "queue", "state", "verdict"}
    order = ["1", "2", *(text_order(quote(c)) if c in texts else quote(c) for c in spec["key"][2:])]
    return (f"SELECT cluster_id, {hour_sql(quote('hour'), 'day')} AS d, {', '.join(rest)}, "
            + ", ".join(f"SUM({quote(s)})" for s in day["all_sums"])
            + f" FROM {quote(spec['model']._meta.db_table)} WHERE {where}"
            f" GROUP BY cluster_id, {hour_sql(quote('hour'), 'day')}, {', '.join(rest)} ORDER BY {', '.join(order)}")
