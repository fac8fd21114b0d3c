"""Reference checker for the sweep-and-review demo: a deterministic verdict per run.

The review agents' verdicts are compared with these to give an agreement
figure. With the scripted stand-in model (demo/demo_model.py, ``--script
review``) that figure checks the plumbing (sweep -> review chained with
-hold_jid_ad -> tool call -> proxy -> model -> verdict -> record -> page),
NOT a model's quality: :data:`SCRIPTED_CAVEAT` says so wherever it is shown.

A run (``run-<task>.txt`` of demo/demo_sweep.py) is ``ok`` only if its log
ends with ``summary: status=ok``, every number in it is finite and the energy
did not grow (a damped oscillator loses energy); otherwise ``bad``, with the
reason ``missing``, ``no_summary`` (the log just stops: a hard crash),
``crashed``, ``diverged``, ``non_finite`` or ``energy_grew``.

``python -m demo.reference_checker RUN_FILE...`` prints one verdict per file.
"""
from __future__ import annotations

import math
import re
import sys
from typing import Iterable

SCRIPTED_CAVEAT = ("The review model is the scripted stand-in (demo/demo_model.py --script review): this "
                   "agreement checks the plumbing, not a model's quality.")
_STATUS_RE = re.compile(r"^summary: status=(\w+)", re.MULTILINE)
_NUMBER_RE = re.compile(r"(?:x|v|energy|final_energy|energy_ratio)=(\S+)")


def check_run(text: str | None) -> tuple[str, str]:
    """``(verdict, reason)`` for one run's log text (None: the file is missing)."""
    if text is None:
        return "bad", "missing"
    statuses = _STATUS_RE.findall(text)
    if not statuses:
        return "bad", "no_summary"
    status = statuses[-1]
    if status != "ok":
        return "bad", status if status in ("crashed", "diverged") else f"status_{status}"
    numbers = []
    for raw in _NUMBER_RE.findall(text):
        try:
            numbers.append(float(raw))
        except ValueError:
            return "bad", "non_finite"
    if not all(math.isfinite(n) for n in numbers):
        return "bad", "non_finite"
    ratio = re.search(r"energy_ratio=(\S+)", text)
    if ratio is None or float(ratio.group(1)) > 1.0 + 1e-9:
        return "bad", "energy_grew"
    return "ok", "ok"


def check_file(path: str) -> tuple[str, str]:
    """:func:`check_run` of the file at ``path``."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return check_run(fh.read())
    except FileNotFoundError:
        return check_run(None)


def agreement(pairs: Iterable[tuple[str | None, str]]) -> dict:
    """Agreement of ``(agent verdict or None, reference verdict)`` pairs:
    ``{"total", "agreed", "agreement" (0..1, None when empty), "caveat"}``.
    A missing agent verdict counts as a disagreement."""
    pairs = list(pairs)
    agreed = sum(1 for agent, reference in pairs if agent is not None and agent == reference)
    return {"total": len(pairs), "agreed": agreed, "agreement": (agreed / len(pairs)) if pairs else None,
            "caveat": SCRIPTED_CAVEAT}


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the deterministic verdict of each run log named in ``argv``; returns 0."""
    for path in (sys.argv[1:] if argv is None else argv):
        verdict, reason = check_file(path)
        print(f"{path}: {verdict} ({reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
