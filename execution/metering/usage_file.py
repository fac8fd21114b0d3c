"""The task's token totals as a Grid Engine usage file (OCS/GCS 9 flexible accounting).

See :func:`usage_file_lines` and GRIDENGINE.md section 2; the runner writes
``<task>.usage`` and execution/usage_epilog.py appends it to the shepherd's file.
"""
from __future__ import annotations

import os
from decimal import Decimal
from typing import Any, Mapping

from execution.spool.contract import TOKEN_FIELDS

__all__ = ["USAGE_FILE_KEYS", "usage_file_lines", "append_usage_file"]

#: Totals keys written to the usage file, in this order, each as ``tco_<key>``.
USAGE_FILE_KEYS = ("requests", "refused", "rate_limited", *TOKEN_FIELDS, "total_tokens", "unpriced_tokens",
                   "cost_usd")


def usage_file_lines(totals: Mapping[str, Any], prefix: str = "tco_") -> list[str]:
    """``key=value`` lines for a Grid Engine job's usage file from the proxy's
    totals (:meth:`execution.metering.proxy.MeteringProxy.totals`).

    OCS/GCS 9 "flexible accounting" (GRIDENGINE.md section 2): lines appended
    to ``$SGE_JOB_SPOOL_DIR/usage`` whose names match the cluster's
    ``reporting_params usage_patterns`` (e.g. ``tco:tco_*``) go into the
    accounting record's ``usage`` and ``qacct -j`` prints them. qacct <= 9.1
    reads them as doubles, so every value written is a plain number: token
    counts as integers, ``cost_usd`` as a fixed-point decimal (omitted when
    the totals have none, i.e. nothing was priced). Keys missing from
    ``totals`` are skipped. Raises ValueError on a non-numeric value.
    """
    lines = []
    for key in USAGE_FILE_KEYS:
        value = totals.get(key)
        if value is None:
            continue
        if isinstance(value, bool):
            raise ValueError(f"{key}: not a number: {value!r}")
        if key == "cost_usd":
            number = Decimal(str(value))
            if not number.is_finite():
                raise ValueError(f"{key}: not a finite number: {value!r}")
            text = format(number, "f")
        elif isinstance(value, int):
            text = str(value)
        else:
            raise ValueError(f"{key}: not an integer: {value!r}")
        lines.append(f"{prefix}{key}={text}")
    return lines


def append_usage_file(path: str | os.PathLike, totals: Mapping[str, Any], prefix: str = "tco_") -> list[str]:
    """Append :func:`usage_file_lines` to the usage file at ``path`` (the
    shepherd's lines already there are kept), one write, then fsync. Returns
    the lines written. Raises OSError if the file cannot be written (it
    belongs to the admin user: call this from an epilog run as that user, or
    give the runner the path of a file the epilog appends)."""
    lines = usage_file_lines(totals, prefix)
    with open(path, "a+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                fh.write(b"\n")  # append mode: writes always go to the end
        fh.write("".join(line + "\n" for line in lines).encode("ascii"))
        fh.flush()
        os.fsync(fh.fileno())
    return lines
