"""Groups of task and campaign states that pages, live views and bills share."""
from __future__ import annotations

from execution.spool import TOKEN_BUCKETS

FAILURE_STATES = ("error", "failed", "lost")
QUEUED_STATES = ("pending", "held")
UNFINISHED_CAMPAIGN = ("submitting", "submitted", "running", "paused", "waiting")
TOKEN_FIELDS = TOKEN_BUCKETS  # the disjoint buckets (execution/spool.py); reasoning is inside output
