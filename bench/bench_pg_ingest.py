"""Accounting ingest into PostgreSQL: records/s and peak RSS, beside a plain insert loop and SQLite.

Goal (issue 14): >= 200,000 records/s into PostgreSQL, memory flat. Printed
in one run, on the same server:

* tco ingest: ``ingest_accounting`` end to end (read and parse the file,
  link to tasks, store with ``dashboards.core.bulk``: COPY into a staging table
  and one ``INSERT ... ON CONFLICT DO NOTHING`` a batch, checkpoint);
* tco parse: ``read_accounting`` over the file in the ingest's batches, alone;
* tco store: ``dashboards.core.bulk.store_accounting_records`` alone, on records
  parsed beforehand (the part that is PostgreSQL's, with the usage rollups);
* baselines: the plain loop, ``line.split(b':')`` and a parameterised
  ``INSERT`` per record (psycopg ``executemany``) into a bare table; the same
  split lines through ``COPY`` (``write_row``) into a bare table of text columns;
* SQLite: ``bench/bench_accounting_ingest.py`` run with the same record count.

Needs the server of ``scripts/postgres`` (or ``DATABASE_URL`` naming a role
that may create databases); it makes a database of its own and drops it.

    .venv/bin/python bench/bench_pg_ingest.py [--records 1000000] [--no-sqlite]
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_accounting_ingest import make_file  # noqa: E402


def server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        path = os.environ.get("DATABASE_URL_FILE", "/etc/tco/database-url")
        url = Path(path).read_text().strip()
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"DATABASE_URL is not a PostgreSQL URL: {url.split('@')[-1]}")
    return url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite run")
    args = parser.parse_args()
    n = args.records

    import psycopg

    base_url = server_url()
    db = f"tco_bench_{os.getpid()}"
    bench_url = re.sub(r"/[^/?]*(\?|$)", f"/{db}\\1", base_url.split("://", 1)[1], count=1)
    bench_url = base_url.split("://", 1)[0] + "://" + bench_url
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    try:
        tmp = Path(tempfile.mkdtemp(prefix="tco-bench-pg-"))
        os.environ["DATABASE_URL"] = bench_url
        os.environ.pop("DATABASE_URL_FILE", None)
        os.environ.setdefault("TCO_STATE_DIR", str(tmp))
        os.environ["DJANGO_SETTINGS_MODULE"] = "tco_web.settings"
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, transaction

        call_command("migrate", verbosity=0)
        from dashboards.core.bulk import store_accounting_records
        from dashboards.ingest.accounting import ingest_accounting
        from dashboards.models import AccountingRecord
        from dashboards.core.clusters import cluster_get_default
        from schedulers.gridengine.parsers.accounting import read_accounting

        acct = tmp / "accounting"
        make_file(acct, n)
        size_mb = acct.stat().st_size / 1e6
        cluster = cluster_get_default()

        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        result = ingest_accounting(cluster, path=str(acct), time_budget_s=3600)
        ours = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        stored = AccountingRecord.objects.count()
        again = ingest_accounting(cluster, path=str(acct), time_budget_s=3600)

        # The store alone: parse first (batches as ingest reads them), then time only the inserts.
        with connection.cursor() as cur:  # an empty table again, without delete's dead rows
            cur.execute(f"TRUNCATE {AccountingRecord._meta.db_table}")
        batches, cursor = [], None
        t0 = time.perf_counter()
        while True:
            batch = read_accounting(str(acct), cursor, max_bytes=2 * 1024 * 1024)
            if not batch.records:
                break
            batches.append(batch.records)
            cursor = batch.cursor
        parse = time.perf_counter() - t0
        t0 = time.perf_counter()
        for records in batches:
            with transaction.atomic():
                store_accounting_records(cluster, records)
        store = time.perf_counter() - t0
        stored_again = AccountingRecord.objects.count()
        # PostgreSQL's own share, the floor of any store: every row already on the server (an unlogged
        # table, filled untimed), then the store's statement alone (insert on the identity, indexes,
        # the usage rollups) in batches of the same size.
        from dashboards.core import bulk, rollups

        table = AccountingRecord._meta.db_table
        with connection.cursor() as cur:
            cur.execute(f"CREATE UNLOGGED TABLE bench_stage AS SELECT * FROM {table}")
            cur.execute(f"TRUNCATE {table}")
            cur.execute("ALTER TABLE bench_stage ADD COLUMN n bigserial")
            cur.execute("CREATE INDEX ON bench_stage (n)")  # each batch reads its own rows only
            cur.execute("ANALYZE bench_stage")
        columns = bulk._column_list()
        size = max(len(b) for b in batches)
        t0 = time.perf_counter()
        for start in range(0, n, size):
            with transaction.atomic(), connection.cursor() as cur:
                # As core.bulk's insert: the count and the records' rollup groups come back, and are added.
                cur.execute(bulk.insert_grouped_sql(table, columns, f"SELECT {columns} FROM bench_stage "
                                                             f"WHERE n > {start} AND n <= {start + size}"))
                rollups.records_grouped(row[1:] for row in cur.fetchall())
        server = time.perf_counter() - t0
        del batches
        connection.close()

        # Baseline: the plain insert loop into a bare table, same server, same file.
        with psycopg.connect(bench_url) as con:
            con.execute("CREATE TABLE acct (" + ", ".join(f"f{i} text" for i in range(45)) + ")")
            sql = f"INSERT INTO acct VALUES ({', '.join(['%s'] * 45)})"
            t0 = time.perf_counter()
            rows = []
            with open(acct, "rb") as fh, con.cursor() as cur:
                for line in fh:
                    if line.startswith(b"#"):
                        continue
                    rows.append(line.rstrip(b"\n").decode().split(":"))
                    if len(rows) == 50_000:
                        cur.executemany(sql, rows)
                        rows.clear()
                if rows:
                    cur.executemany(sql, rows)
            con.commit()
            base = time.perf_counter() - t0
            # The other plain floor: the same split lines through COPY (no parse into types, no identity).
            con.execute("CREATE TABLE acct_copy (" + ", ".join(f"f{i} text" for i in range(45)) + ")")
            t0 = time.perf_counter()
            with open(acct, "rb") as fh, con.cursor() as cur, cur.copy("COPY acct_copy FROM STDIN") as copy:
                for line in fh:
                    if not line.startswith(b"#"):
                        copy.write_row(line.rstrip(b"\n").decode().split(":"))
            con.commit()
            base_copy = time.perf_counter() - t0
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(base_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}"')

    sqlite_line = "skipped (--no-sqlite)"
    if not args.no_sqlite:
        out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_accounting_ingest.py"), "--records", str(n)],
                             capture_output=True, text=True, check=True, env={**os.environ, "DATABASE_URL": ""}).stdout
        found = re.search(r"tco ingest:\s+([\d.]+) s\s+([\d,]+) records/s", out)
        sqlite_line = f"{float(found.group(1)):7.2f} s  {found.group(2):>10} records/s" if found else out

    print(f"records: {n:,} ({size_mb:.0f} MB file), stored {stored:,}, batches {result.batches}, "
          f"re-ingest added {again.accepted}")
    print(f"PostgreSQL tco ingest (end to end): {ours:7.2f} s  {n / ours:10,.0f} records/s  (goal >= 200,000/s)")
    print(f"  of which, parse alone (read_accounting, 2 MiB batches): {parse:7.2f} s  {n / parse:10,.0f} records/s")
    print(f"PostgreSQL tco store (COPY+upsert): {store:7.2f} s  {n / store:10,.0f} records/s  "
          f"(stored {stored_again:,}; the usage rollups in the same statement)")
    print(f"  the rest of the ingest (find tasks, quarantine, checkpoint): {max(ours - parse - store, 0):7.2f} s")
    print(f"PostgreSQL's own share of the store (rows already on the server): {server:7.2f} s  "
          f"{n / server:10,.0f} records/s  (the ceiling of any store through this table and its indexes)")
    print(f"PostgreSQL plain insert loop:       {base:7.2f} s  {n / base:10,.0f} records/s")
    print(f"PostgreSQL plain COPY loop:         {base_copy:7.2f} s  {n / base_copy:10,.0f} records/s  "
          "(split lines, text columns, no types)")
    print(f"SQLite tco ingest (end to end):     {sqlite_line}")
    print(f"peak RSS: {rss1 / 1024:.0f} MiB (before ingest {rss0 / 1024:.0f} MiB)")
    assert stored == n and stored_again == n, "not every record was stored"
    assert again.accepted == 0, "a re-read stored records twice"


if __name__ == "__main__":
    main()
