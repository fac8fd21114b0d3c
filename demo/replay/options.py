"""What the seed replay runs (:class:`ReplayOptions`) and what it compares with (:data:`ARTICLE`).
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics
from pathlib import Path
from typing import Sequence

__all__ = ["ARTICLE", "GOAL_FACTOR", "URGENT_GOAL_S", "WORK_SIGMA", "WORK_MEDIAN_S", "CRASH_REASONS", "WHY",
           "ReplayError", "ReplayOptions", "work_durations", "median"]

#: The article's figures (its stage table is the medians of the 256 review agents; seconds).
ARTICLE = {
    "submit": 0.04,
    "integration_overhead": 2.0,   # "under 2"
    "sandbox_start": 13.0,
    "agent_work": 21.9,
    "queue_wait": 38.7,
    "all_in_scheduler_s": 5.2,     # 256 sandboxes, command-line qsub
    "first_running_s": 13.4,
    "submissions_per_min": 2950.0,
    "urgent_wait_s": 0.0,
    "review_agreement": 0.93,
}
#: The issue's goals: (figure, comparison, bound) checked by demo/replay/report.py ``goals``.
GOAL_FACTOR = 10.0
URGENT_GOAL_S = 2.0
#: Spread of the demo agents' work: ln(work) ~ N(ln(median), WORK_SIGMA), clipped to [0.5, 2] x median.
WORK_SIGMA = 0.25
WORK_MEDIAN_S = ARTICLE["agent_work"]
#: The reference checker's reasons that mean a crashed run: the log says so, or just stops (an abort).
CRASH_REASONS = ("crashed", "no_summary")


#: Why a stage goal can be missed on the dev cluster (shown with a missed goal).
WHY = {
    "sandbox_start": "bubblewrap's start (namespaces, mounts of the policy) on a host whose cores the "
                     "running agents share",
    "integration_overhead": "the runner's own steps around the sandbox (its interpreter's start, the metering "
                            "proxy, output collection, the runner record) on 2 cores shared by up to 96 running "
                            "agents and their sandboxes",
}


class ReplayError(Exception):
    """The replay cannot go on (a missing team, agent, endpoint or worker; a timeout)."""


@dataclasses.dataclass
class ReplayOptions:
    """What to replay. ``agents``: tasks of run 1 (split between the teams); ``sweep``: sweep runs
    and review agents of run 2 (0 skips it); ``work_scale``: factor on the agents' work median;
    ``submit_here``: submit in this process instead of waiting for the submit worker;
    ``timeout_s``: the longest the replay waits for a run; ``poll_s``: ingest loop period."""

    agents: int = 410
    sweep: int = 256
    work_scale: float = 1.0
    submit_here: bool = False
    timeout_s: float = 1800.0
    poll_s: float = 1.0
    endpoint: str = "demo-stand-in"
    user: str = "admin"
    out_dir: Path | None = None
    seed: int = 410
    #: Items 4 and 5 (demo/watch/): ``live`` watches run 1 from qstat and from the browser (an
    #: admin's sockets); ``watchers`` more clients of both teams; the web server at ``web_url``
    #: (default ``http://127.0.0.1:$TCO_PORT``); ``pids``: processes whose memory is sampled
    #: (default: scripts/services' pid files); ``qstat_sample_s``: the sampler's period.
    live: bool = True
    watchers: int = 50
    web_url: str | None = None
    pids: dict[str, int] | None = None
    qstat_sample_s: float = 0.25


def work_durations(count: int, *, scale: float = 1.0, seed: int = 410) -> list[float]:
    """``count`` agent work times in seconds: log-normal with median ``WORK_MEDIAN_S * scale`` and
    sigma ``WORK_SIGMA`` (of the logarithm), clipped to half and twice the median, 0.1 s resolution;
    seeded, so a replay is repeatable."""
    rng = random.Random(seed)
    median = WORK_MEDIAN_S * scale
    out = []
    for _ in range(count):
        value = median * math.exp(rng.gauss(0.0, WORK_SIGMA))
        out.append(round(min(max(value, median / 2), median * 2), 1))
    return out


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
