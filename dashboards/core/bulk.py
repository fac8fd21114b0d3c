"""Storing accounting records in bulk, each database the way it is fast at.

``store_accounting_records(cluster, records, task_of)`` inserts parsed
accounting records (``schedulers.base.AccountingRecord``) into
``AccountingRecord``'s table, skipping every record whose identity (DESIGN.md:
cluster, job_number, task_number, pe_taskid, the three times and the execution host) is already
stored, and returns how many it inserted. It runs inside the caller's
transaction, so the records and the ingest checkpoint commit together: a
batch re-read after a crash inserts nothing twice (exactly once).

* SQLite: one ``INSERT ... ON CONFLICT DO NOTHING`` statement run with
  ``executemany`` (SQLite >= 3.24), no model instance per record.
* PostgreSQL: the batch is streamed with ``COPY ... FROM STDIN`` (binary
  format, PostgreSQL manual "COPY"; psycopg 3 ``Copy.write_row``) into a session-local temporary staging
  table, then moved by one ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``
  (rows conflicting with each other inside the batch are dropped too). The
  staging table is made anew for each batch and dropped after it.

Memory is one batch's rows: the caller (``dashboards.ingest``) reads the
accounting file in batches of a bounded size.

``insert_like(template, field, values)`` inserts one row per value that
differs from ``template`` (an unsaved model instance) only in ``field``:
a campaign's pending tasks at submission. SQLite: one ``INSERT ... ON
CONFLICT DO NOTHING`` run with ``executemany``; PostgreSQL: ``COPY`` into a
staging table and one such ``INSERT ... SELECT``; each column's value
prepared once instead of a model instance per row.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Sequence

from django.db import connection, models, transaction

from dashboards.models import AccountingRecord, Cluster
from schedulers.base import AccountingRecord as ParsedRecord

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
STAGE_TABLE = "tco_accounting_stage"

# The JSON columns of a record (text in PostgreSQL's staging table).
JSON_COLUMNS = ("usage", "tokens")
# What the rollups read of a record just inserted (dashboards.core.rollup_sql.record_select).
ROLLUP_COLUMNS = ("cluster_id", "task_id", "started_at", "project", "queue", "wallclock_s", "slots")

# The columns written, in the order of the rows built by ``record_rows``.
RECORD_COLUMNS = (
    "cluster_id", "task_id", "job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us",
    "submitted_at", "started_at", "ended_at", "job_name", "owner", "group", "project", "department", "account",
    "queue", "hostname", "slots", "wallclock_s", "wallclock_exact_s", "cpu_s", "maxvmem_bytes", "failed",
    "exit_status", "category", "usage", "tokens",
)


def epoch_us(value: dt.datetime | None) -> int:
    """``value`` (aware) as integer microseconds since 1970-01-01 UTC; 0 for None (the file's "never")."""
    if value is None:
        return 0
    delta = value - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def record_rows(cluster: Cluster, records: Sequence[ParsedRecord], task_of: dict[int, int] | None = None,
                *, sqlite: bool, tokens: dict[int, dict] | None = None, json_text: bool = False) -> list[tuple]:
    """One tuple per record in ``RECORD_COLUMNS`` order.

    ``task_of`` maps a record's index in ``records`` to its task's id.
    Times become (microseconds, database value). For SQLite (``sqlite``) the
    database values are Django's naive-UTC text and ``usage`` as JSON text;
    otherwise aware UTC datetimes and ``usage`` as the dict itself (binary
    COPY's jsonb dumper serialises it), or with ``json_text`` as JSON text
    (PostgreSQL's staging table holds it as text: the empty usage most records
    have is then the one string ``"{}"``, not a dict dumped per record). Text
    is cut to the column widths.
    """
    task_of = task_of or {}
    tokens = tokens or {}
    dumps = json.dumps

    def usage(value: dict):
        if sqlite or json_text:
            return dumps(value) if value else "{}"
        return value or {}

    # Records of one campaign share few distinct times: convert each once.
    times: dict = {None: (0, None)}

    def conv(value):
        hit = times.get(value)
        if hit is None:
            utc = value.astimezone(dt.timezone.utc)
            hit = times[value] = (epoch_us(utc), utc.isoformat(" ")[:-6] if sqlite else utc)
        return hit

    rows = []
    cluster_id = cluster.pk
    for i, r in enumerate(records):
        sub_us, sub = conv(r.submitted_at)
        start_us, start = conv(r.started_at)
        end_us, end = conv(r.ended_at)
        rows.append((
            cluster_id, task_of.get(i), r.job_number, r.task_number or 0, r.pe_taskid or "",
            sub_us, start_us, end_us, sub, start, end,
            r.job_name[:255], r.owner[:64], r.group[:64], (r.project or "")[:64], (r.department or "")[:64],
            r.account[:255], r.queue[:64], r.hostname[:255], r.slots, r.wallclock_s, r.wallclock_exact_s,
            r.cpu_s, r.maxvmem_bytes, r.failed, r.exit_status, r.category, usage(r.usage),
            usage(tokens.get(i) or {}),
        ))
    return rows


def store_accounting_records(cluster: Cluster, records: Sequence[ParsedRecord],
                             task_of: dict[int, int] | None = None, *, tokens: dict[int, dict] | None = None) -> int:
    """Insert ``records`` not stored yet (by identity); returns the number inserted.

    ``tokens``: {index in ``records``: token totals per bucket} read from the
    record's flexible-accounting group (``dashboards.ingest.accounting.accounting_tokens``),
    stored as ``AccountingRecord.tokens`` (``{}`` for the others).
    ``task_of``: {index in ``records``: Task id} for the records that belong
    to a task (``dashboards.ingest`` finds them). The records inserted are
    added to the usage rollups in the same statement or transaction
    (``dashboards.core.rollups``); records that ended before the cluster's
    ``detail_dropped_before`` are skipped (dropped by the detail retention,
    their usage is in the rollups). Runs in the caller's
    transaction. SQLite: one multi-row ``INSERT ... ON CONFLICT DO NOTHING``;
    PostgreSQL: binary COPY into a staging table, then one such insert; any
    other backend: Django's ``bulk_create(ignore_conflicts=True)`` (slower,
    the count taken before and after). Raises what the driver raises on a
    database error.
    """
    dropped = cluster.detail_dropped_before
    if dropped is not None and records:
        # Records that ended before the detail retention's cut were counted (in the rollups) and
        # dropped: read again (the file re-read from its start), they are not stored twice.
        keep = [i for i, r in enumerate(records) if r.ended_at is None or r.ended_at >= dropped]
        if len(keep) < len(records):
            task_of = {n: task_of[i] for n, i in enumerate(keep) if task_of and i in task_of}
            tokens = {n: tokens[i] for n, i in enumerate(keep) if tokens and i in tokens}
            records = [records[i] for i in keep]
    if not records:
        return 0
    from dashboards.core import rollups

    # Records of tco's tasks change those tasks' share of the waste rollups (their records by end
    # state and attempt); their usage share is added by the insert itself.
    task_ids = sorted(set(task_of.values())) if task_of else []
    with rollups.tasks_rolled(task_ids, usage=False) if task_ids else contextlib.nullcontext():
        if connection.vendor == "postgresql":
            return _store_postgresql(cluster, records, task_of, tokens)
        if connection.vendor == "sqlite":
            return _store_sqlite(cluster, records, task_of, tokens)
        return _store_portable(cluster, records, task_of, tokens)


def _store_portable(cluster: Cluster, records: Sequence[ParsedRecord], task_of: dict[int, int] | None,
                    tokens: dict[int, dict] | None = None) -> int:
    """Any backend Django supports: the ORM's conflict-ignoring bulk insert. It reports no count,
    so the records of the batch's jobs are counted before and after (in the caller's transaction);
    the rows above the highest id before go into the rollups (one ingester per cluster)."""
    from dashboards.core import rollups

    rows = record_rows(cluster, records, task_of, sqlite=False, tokens=tokens)
    objects = [AccountingRecord(**dict(zip(RECORD_COLUMNS, row))) for row in rows]
    stored = AccountingRecord.objects.filter(cluster=cluster, job_number__in={r.job_number for r in records})
    with transaction.atomic():
        before = stored.count()
        last_id = AccountingRecord.objects.order_by("-id").values_list("id", flat=True).first() or 0
        AccountingRecord.objects.bulk_create(objects, batch_size=500, ignore_conflicts=True)
        rollups.add_records_after(cluster.pk, last_id)
        return stored.count() - before


def _column_list() -> str:
    quote = connection.ops.quote_name
    return ", ".join(quote(c) for c in RECORD_COLUMNS)


def _store_sqlite(cluster: Cluster, records: Sequence[ParsedRecord], task_of: dict[int, int] | None,
                  tokens: dict[int, dict] | None = None) -> int:
    from dashboards.core import rollups

    rows = record_rows(cluster, records, task_of, sqlite=True, tokens=tokens)
    table = connection.ops.quote_name(AccountingRecord._meta.db_table)
    sql = (f"INSERT INTO {table} ({_column_list()}) "
           f"VALUES ({', '.join(['%s'] * len(RECORD_COLUMNS))}) ON CONFLICT DO NOTHING")
    with transaction.atomic(), connection.cursor() as cur:
        # The write lock is ours from here to the commit, and ids only grow: the rows above the
        # highest id now are the ones this insert stores, and go into the rollups.
        cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")
        last_id = cur.fetchone()[0]
        cur.executemany(sql, rows)
        # sqlite3 sums rowcount over executemany; a skipped conflict counts 0.
        inserted = cur.rowcount
        if inserted:
            rollups.add_records_after(cluster.pk, last_id)
        return inserted


def _store_postgresql(cluster: Cluster, records: Sequence[ParsedRecord], task_of: dict[int, int] | None,
                      tokens: dict[int, dict] | None = None) -> int:
    from dashboards.core import rollups

    rows = record_rows(cluster, records, task_of, sqlite=False, tokens=tokens, json_text=True)
    table = connection.ops.quote_name(AccountingRecord._meta.db_table)
    columns = _column_list()
    # The JSON columns travel as text and become jsonb in the INSERT ... SELECT below.
    selected = ", ".join(f"{connection.ops.quote_name(c)}::jsonb" if c in JSON_COLUMNS else connection.ops.quote_name(c)
                         for c in RECORD_COLUMNS)
    with connection.cursor() as cur:
        # The staging table has the target's column types (as they are now,
        # after any migration; the JSON ones as text) and no index or constraint; temporary,
        # so it lives in this session only (another worker's batch never meets it),
        # is never WAL-logged, and is dropped at commit.
        cur.execute(f"DROP TABLE IF EXISTS pg_temp.{STAGE_TABLE}")
        cur.execute(f"CREATE TEMPORARY TABLE {STAGE_TABLE} ON COMMIT DROP AS "
                    f"SELECT {columns} FROM {table} WITH NO DATA")
        cur.execute(f"ALTER TABLE {STAGE_TABLE} "
                    + ", ".join(f"ALTER COLUMN {connection.ops.quote_name(c)} TYPE text" for c in JSON_COLUMNS))
        # Binary COPY needs each value's exact type: the staging table's own, in column order.
        cur.execute("SELECT atttypid FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", [STAGE_TABLE])
        oids = [int(oid) for (oid,) in cur.fetchall()]
        raw = cur.cursor  # psycopg's own cursor: Django's wrapper has no copy()
        with raw.copy(f"COPY {STAGE_TABLE} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(oids)
            for row in rows:
                copy.write_row(row)
        # The rows inserted (not those already stored): their count and their rollup groups come back
        # from the insert's own statement (one row of NULL groups when it inserted nothing).
        cur.execute(insert_grouped_sql(table, columns, f"SELECT {selected} FROM {STAGE_TABLE}"), [])
        rows = cur.fetchall()
        inserted = rows[0][0]
        rollups.records_grouped(row[1:] for row in rows)
        cur.execute(f"DROP TABLE {STAGE_TABLE}")
    return inserted


def insert_grouped_sql(table: str, columns: str, select: str) -> str:
    """PostgreSQL: insert the accounting records ``select`` gives into ``table`` (``columns``), skipping
    identities already stored, and answer the count inserted then the inserted records' rollup groups
    (``rollup_sql.record_select``) in each row: ``(n, key..., sums...)``, one row of NULL groups when
    nothing was inserted; for ``rollups.records_grouped``."""
    from dashboards.core.rollup_sql import record_select

    returned = ", ".join(connection.ops.quote_name(c) for c in ROLLUP_COLUMNS)
    return (f"WITH ins AS (INSERT INTO {table} ({columns}) {select} ON CONFLICT DO NOTHING RETURNING {returned}), "
            f"n AS (SELECT COUNT(*) AS n FROM ins) SELECT n.n, g.* FROM n LEFT JOIN ({record_select('ins')}) g ON true")


def insert_like(template: models.Model, field: str, values: Sequence) -> int:
    """Insert one row of ``template``'s table per value in ``values``: every column as ``template``
    has it (its defaults; ``auto_now``/``auto_now_add`` fields set now), ``field`` (an attribute
    name, e.g. ``task_number``) set to the value. Rows conflicting with a stored row's unique
    constraint are skipped (``ON CONFLICT DO NOTHING``: SQLite >= 3.24, PostgreSQL >= 9.5).
    Runs in the caller's transaction; returns the number of rows inserted (SQLite and PostgreSQL
    report it; a driver that reports -1 gives -1). No model instance per row and no signals: about
    10 times quicker than ``bulk_create`` for 10,000 tasks of 45 columns (bench/bench_launch.py,
    where the rows are created after the DRMAA call and the next campaign waits for them).
    Raises ValueError for a field the table does not have, and what the driver raises on a
    database error."""
    return insert_varying(template, (field,), [(value,) for value in values])


def insert_varying(template: models.Model, fields: Sequence[str], rows: Sequence[Sequence]) -> int:
    """:func:`insert_like` for several varying columns: ``fields`` (attribute names) take their
    values from each row of ``rows`` (tuples in ``fields`` order), every other column is as
    ``template`` has it. Each distinct value of a column is prepared for the database once (a
    poll's new tasks share their names, owners, states and times). Same conflict rule, return
    value and errors as :func:`insert_like`."""
    meta = template._meta
    columns = [f for f in meta.concrete_fields if not (f.primary_key and f.auto_created or
                                                          isinstance(f, models.AutoField))]
    position = {f.attname: i for i, f in enumerate(columns)}
    missing = [name for name in fields if name not in position]
    if missing:
        raise ValueError(f"{meta.label} has no column {missing[0]!r}")
    if not rows:
        return 0
    prepared = [f.get_db_prep_save(f.pre_save(template, add=True), connection) for f in columns]
    slots = [(position[name], columns[position[name]]) for name in fields]
    memo: list[dict] = [{} for _ in fields]
    out = []
    for values in rows:
        row = list(prepared)
        for (at, column), seen, value in zip(slots, memo, values):
            key = (value.__class__, value)  # 1, 1.0 and True are equal keys, not the same value
            try:
                row[at] = seen[key]
            except KeyError:
                row[at] = seen[key] = column.get_db_prep_save(value, connection)
            except TypeError:  # an unhashable value (a dict for a JSON column)
                row[at] = column.get_db_prep_save(value, connection)
        out.append(row)
    quote = connection.ops.quote_name
    names = ", ".join(quote(f.column) for f in columns)
    if connection.vendor == "postgresql":
        return _insert_copied(quote(meta.db_table), names, out)
    sql = (f"INSERT INTO {quote(meta.db_table)} ({names}) "
           f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT DO NOTHING")
    with connection.cursor() as cur:
        cur.executemany(sql, out)
        return cur.rowcount


INSERT_STAGE = "tco_insert_stage"


def _insert_copied(table: str, names: str, rows: list[list]) -> int:
    """PostgreSQL: ``rows`` streamed by ``COPY`` (text format: each value as psycopg adapts it) into a
    temporary table shaped like ``table``, then one ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``.
    A parameterised ``INSERT`` per row stored about 4,000 tasks or 8,000 model requests a second;
    this about ten times that (bench/bench_history.py)."""
    from psycopg.types.json import Json, Jsonb

    dumped: dict[int, str] = {}  # a JSON value shared by the rows (the template's) is dumped once

    def text(value):
        if isinstance(value, (Json, Jsonb)):
            hit = dumped.get(id(value))
            if hit is None:
                hit = dumped[id(value)] = (value.dumps or json.dumps)(value.obj)
            return hit
        return value

    json_columns = sorted({i for row in rows[:1] for i, v in enumerate(row) if isinstance(v, (Json, Jsonb))})
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS pg_temp.{INSERT_STAGE}")
        cur.execute(f"CREATE TEMPORARY TABLE {INSERT_STAGE} ON COMMIT DROP AS SELECT {names} FROM {table} "
                    "WITH NO DATA")
        with cur.cursor.copy(f"COPY {INSERT_STAGE} ({names}) FROM STDIN") as copy:
            for row in rows:
                for i in json_columns:
                    row[i] = text(row[i])
                copy.write_row(row)
        cur.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {INSERT_STAGE} ON CONFLICT DO NOTHING")
        inserted = cur.rowcount
        cur.execute(f"DROP TABLE {INSERT_STAGE}")
    return inserted



def update_by_pk(model: type[models.Model], fields: Sequence[str], rows: Sequence[Sequence]) -> int:
    """Set ``fields`` (attribute names of ``model``) of each row named by its primary key:
    ``rows`` are tuples ``(pk, value of fields[0], value of fields[1], ...)``. One prepared
    ``UPDATE <table> SET f1 = %s, ... WHERE <pk> = %s`` run with ``executemany`` (SQLite: one
    statement stepped per row; psycopg 3: the rows pipelined), each distinct value prepared for
    the database once. ``QuerySet.bulk_update`` builds a ``CASE WHEN pk = ... THEN ...`` per field and
    row in Python: for a poll in which 96 tasks started at once that was about 0.3 s of CPU
    (bench/bench_poll.py --series --step 96), this a few milliseconds. Runs in the caller's
    transaction; no signals, no ``auto_now``. Returns the number of rows updated (-1 when the driver
    does not say). Raises ValueError for a field the table does not have, and what the driver raises
    on a database error."""
    meta = model._meta
    by_name = {f.attname: f for f in meta.concrete_fields}
    missing = [name for name in fields if name not in by_name]
    if missing:
        raise ValueError(f"{meta.label} has no column {missing[0]!r}")
    if not rows:
        return 0
    columns = [by_name[name] for name in fields]
    pk = meta.pk
    memo: list[dict] = [{} for _ in fields]
    out = []
    for row in rows:
        values = []
        for column, seen, value in zip(columns, memo, row[1:]):
            key = (value.__class__, value)  # 1, 1.0 and True are equal keys, not the same value
            try:
                values.append(seen[key])
            except KeyError:
                values.append(seen.setdefault(key, column.get_db_prep_save(value, connection)))
            except TypeError:  # an unhashable value (a dict for a JSON column)
                values.append(column.get_db_prep_save(value, connection))
        values.append(pk.get_db_prep_save(row[0], connection))
        out.append(values)
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(c.column)} = %s" for c in columns)
    with connection.cursor() as cur:
        cur.executemany(f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(pk.column)} = %s", out)
        return cur.rowcount
