"""The live watch's figures and its section of the replay report ("Live lag and load").
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from demo.watch.lags import LAG_GOAL_S, LAG_PARTS, PAGE_GOAL_S, lag_summary

__all__ = ["live_figures", "pooled_breakdown", "render_live"]


def live_figures(results: dict[str, Any]) -> dict[str, Any]:
    """The report's figures from :meth:`LiveWatch.results`: ``lag`` (the admin's campaign pages,
    item 4), ``wave`` (its first-wave changes), ``queue`` (its queue page's counts), ``load`` (every
    other client's deliveries pooled, item 5), the clients that missed changes or saw too much."""
    clients = results["clients"]
    admin = next((c for c in clients if c["admin"]), None)
    others = [c for c in clients if not c["admin"]]
    out: dict[str, Any] = {"clients": len(others)}
    if admin:
        out["lag"] = {**lag_summary(admin["lag"]["lags"]), "received": admin["lag"]["received"],
                      "expected": admin["lag"]["expected"], "missed": len(admin["lag"]["missed"])}
        out["wave"] = lag_summary(admin["wave_lags"])
        out["queue"] = lag_summary(admin["queue_lags"])
        out["breakdown"] = admin["breakdown"]
    pooled = [x for c in others for x in c["lag"]["lags"]]
    out["load"] = {**lag_summary(pooled), "received": sum(c["lag"]["received"] for c in others),
                   "expected": sum(c["lag"]["expected"] for c in others),
                   "missed": sum(len(c["lag"]["missed"]) for c in others)}
    out["load_breakdown"] = pooled_breakdown([c["breakdown"] for c in others])
    out["load_queue"] = lag_summary([x for c in others for x in c["queue_lags"]])
    out["incomplete"] = [c["user"] for c in clients if c["lag"]["missed"]]
    out["violations"] = {c["user"]: c["violations"] for c in clients if c["violations"]}
    out["errors"] = {c["user"]: c["errors"][:3] for c in clients if c["errors"]}
    return out


def pooled_breakdown(breakdowns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several :func:`lag_breakdown` results as one (their parts' lists joined, counts summed)."""
    return {"parts": {label: [x for b in breakdowns for x in b["parts"][label]] for label, _, _ in LAG_PARTS},
            "n": sum(b["n"] for b in breakdowns), "unsplit": sum(b["unsplit"] for b in breakdowns)}


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def render_live(results: dict[str, Any]) -> list[str]:
    """The report's section "Live lag and load" (lines)."""
    f = live_figures(results)
    lines = ["", "Live lag (item 4): qstat -> browser, WebSocket (seconds; qstat sampled every "
                 f"{results['qstat_period_s']} s, {results['qstat_samples']} samples, median qstat "
                 f"{_s(results['qstat_p50_s'])} s, {results['qstat_errors']} failed)",
             f"{'what':<58} {'n':>6} {'p50':>7} {'p95':>7} {'max':>7} {'min':>7}"]

    def row(label: str, s: dict) -> None:
        lines.append(f"{label:<58} {s['n']:>6} {_s(s['p50']):>7} {_s(s['p95']):>7} {_s(s['max']):>7} "
                     f"{_s(s['min']):>7}")

    def breakdown_rows(b: dict, what: str) -> None:
        lines.append(f"  {what} ({b['n']} changes split; {b['unsplit']} shown first by a snapshot that "
                     "answered no poll's event):")
        for label, _, _ in LAG_PARTS:
            row(f"    {label}", lag_summary(b["parts"][label]))

    if "lag" in f:
        row("admin, campaign pages, every task change", f["lag"])
        row("  the first wave (started before any ended)", f["wave"])
        row("admin, queue page (campaign counts)", f["queue"])
        breakdown_rows(f["breakdown"], "where the admin's lag went")
        lines.append(f"changes qstat saw: {f['lag']['expected']} ({results['wave']} in the first wave); "
                     f"arrived: {f['lag']['received']}; missed: {f['lag']['missed']}")
        p95 = f["lag"]["p95"]
        if p95 is not None:
            lines.append(f"goal p95 <= {LAG_GOAL_S:.0f} s: " + ("met" if p95 <= LAG_GOAL_S else
                                                                 f"MISSED by {p95 - LAG_GOAL_S:.3f} s"))
    if f["clients"]:
        lines += ["", f"Load (item 5): {f['clients']} WebSocket clients of both teams (queue page + page 1 of "
                      f"a campaign of their team) for {results['duration_s']:.0f} s"]
        row("deliveries, campaign pages, all clients", f["load"])
        breakdown_rows(f["load_breakdown"], "where the clients' lag went")
        row("deliveries, queue page counts, all clients", f["load_queue"])
        lines.append(f"changes the clients may see: {f['load']['expected']}; received {f['load']['received']}; "
                     f"missed {f['load']['missed']} (clients missing any: {len(f['incomplete'])}"
                     + (f", e.g. {f['incomplete'][:3]}" if f["incomplete"] else "") + ")")
        lines.append(f"scoping: {len(f['violations'])} client(s) received what they may not see"
                     + (f": {dict(list(f['violations'].items())[:3])}" if f["violations"] else
                        " (other team's campaigns: every probe refused with 4403)"))
        p95 = f["load"]["p95"]
        if p95 is not None:
            lines.append(f"goal p95 delivery <= {LAG_GOAL_S:.0f} s: " + ("met" if p95 <= LAG_GOAL_S else
                                                                          f"MISSED by {p95 - LAG_GOAL_S:.3f} s"))
    sockets = results.get("sockets")
    if sockets:
        lines.append(f"sockets: {sockets['campaign_pages']} campaign-page sockets had their first snapshot, the last "
                     f"{_s(sockets['last_s'])} s after the launch; {sockets['opened']} sockets in all "
                     "(errors included)")
    if f["errors"]:
        lines.append(f"socket errors: {dict(list(f['errors'].items())[:3])}")
    if results["rss"]:
        lines.append("memory (RSS with children, MiB): " + "; ".join(
            f"{name} {v['start'] / 2**20:.0f} -> peak {v['peak'] / 2**20:.0f} -> end {v['end'] / 2**20:.0f}"
            for name, v in results["rss"].items()))
    if results.get("cpu"):
        lines.append(f"CPU seconds during the load ({_s(results.get('duration_s'))} s on "
                     f"{os.cpu_count()} cores): " + "; ".join(
                         f"{name} {v:.1f}" for name, v in results["cpu"].items()))
    if results.get("cpu_top"):
        lines.append("CPU seconds by command, host-wide: " + "; ".join(
            f"{name} {v:.1f}" for name, v in results["cpu_top"]))
    for kind, s in results["pages"].items():
        lines.append(f"{kind} GET during the run: n {s['n']}, p50 {_s(s['p50'])} s, p95 {_s(s['p95'])} s, "
                     f"max {_s(s['max'])} s (goal <= {PAGE_GOAL_S} s: "
                     + ("met" if s["p95"] is not None and s["p95"] <= PAGE_GOAL_S else "MISSED") + ")")
    if results["page_errors"]:
        lines.append(f"page errors: {results['page_errors'][:3]}")
    return lines
