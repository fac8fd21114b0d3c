"""A bounded accounting ingest in its own process, to be killed or locked out by tests/faults.

    python -m tests.faults.ingest_child [--max-bytes N] [--pause S] [--db-timeout S]

Runs ``dashboards.ingest.accounting.ingest_accounting`` on the default cluster of the
database in ``DATABASE_URL`` until the file is caught up, batch by batch
(``--max-bytes``). After each batch's records are inserted, still inside its
transaction, it prints ``stored <n>`` and sleeps ``--pause`` seconds: a
SIGKILL then lands mid-transaction. ``--db-timeout`` overrides SQLite's busy
timeout (seconds). Exit 0 when caught up (prints ``done <offset>``), 3 when
the database refused (locked, unavailable, or the connection ended: prints ``db-error ...``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-bytes", type=int, default=2048)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--db-timeout", type=float, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")
    import django

    django.setup()
    from django.db import Error as DatabaseError
    from django.db import connections

    from dashboards.ingest import accounting
    from dashboards.models import IngestCheckpoint
    from dashboards.core.clusters import cluster_get_default

    if args.db_timeout is not None:
        connections["default"].settings_dict.setdefault("OPTIONS", {})["timeout"] = args.db_timeout
    store = accounting._store_records
    batches = 0

    def slow_store(cluster, records):
        nonlocal batches
        out = store(cluster, records)
        batches += 1
        print(f"stored {batches}", flush=True)
        time.sleep(args.pause)
        return out

    accounting._store_records = slow_store
    try:
        cluster = cluster_get_default()
        while True:
            result = accounting.ingest_accounting(cluster, max_bytes=args.max_bytes, time_budget_s=5)
            if not (result.accepted or result.duplicates or result.quarantined):
                break
        checkpoint = IngestCheckpoint.objects.get(cluster=cluster, source="accounting")
    except DatabaseError as exc:  # locked, unavailable, or its connection ended (a server restarted)
        print(f"db-error {type(exc).__name__}: {exc}", flush=True)
        return 3
    print(f"done {checkpoint.offset}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
