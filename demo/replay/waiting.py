"""The replay's own ingest loop and what it waits for: submissions, runner records, accounting.
"""
from __future__ import annotations

import datetime as dt
import time
from typing import Callable, Sequence

from django.utils import timezone

from dashboards.core.clusters import scheduler_for
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.launch.submit import campaign_submit
from dashboards.models import AccountingRecord, Campaign, Task
from demo.replay.options import ReplayError

__all__ = ["Ingest", "submitted", "finished"]


class Ingest:
    """tco's ingest steps, run in a loop by the replay: qstat poll, runner records, accounting.

    ``poll_qstat`` False leaves the qstat poll to the workers' (while the replay measures the live
    lag, its own poll would push changes the product's poll had not yet seen)."""

    def __init__(self, cluster, *, poll_qstat: bool = True):
        self.cluster = cluster
        self.scheduler = scheduler_for(cluster)
        self.poll_qstat = poll_qstat

    def step(self) -> None:
        """One round: qstat poll (unless ``poll_qstat`` is False), runner records, accounting."""
        if self.poll_qstat:
            observed = timezone.now()
            tasks = self.scheduler.list_tasks()
            # Beside the workers' poll: a snapshot is applied only if its qstat began after the last
            # applied one answered (dashboards.ingest.poll), whichever poller took it.
            apply_qstat_poll(self.cluster, tasks, observed_at=observed, answered_at=timezone.now())
        ingest_runner_records(self.cluster)
        ingest_accounting(self.cluster)

    def until(self, done: Callable[[], bool], *, timeout_s: float, poll_s: float, what: str) -> None:
        """Step until ``done()``; raises ReplayError after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.step()
            if done():
                return
            if time.monotonic() >= deadline:
                raise ReplayError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(poll_s)


def submitted(campaigns: Sequence[Campaign], *, submit_here: bool, wait_s: float = 60.0) -> list[Campaign]:
    """Submit the campaigns here, or wait for the submit worker to; returns them reloaded.
    Raises ReplayError when the worker has not submitted them within ``wait_s`` seconds."""
    if submit_here:
        here = [campaign_submit(campaign_id=c.pk) for c in campaigns]
        if all(c.job_number for c in here):
            return here
        # The submit worker (make demo runs one) claimed some first: it submits them; wait for it.
    deadline = time.monotonic() + wait_s
    while True:
        fresh = [Campaign.objects.get(pk=c.pk) for c in campaigns]
        if all(c.job_number for c in fresh):
            return fresh
        if time.monotonic() >= deadline:
            raise ReplayError(f"the submit worker did not submit campaign(s) "
                              f"{[c.pk for c in fresh if not c.job_number]} within {wait_s:.0f} s: is it running "
                              "(make demo / scripts/services start)? Or pass --submit-here.")
        time.sleep(0.02)


def finished(campaign_ids: Sequence[int], jobs: Sequence[int] = (), *,
              since: dt.datetime) -> Callable[[], bool]:
    """True once every task of the campaigns has its runner record and every task (and every
    task of the extra ``jobs``) its accounting record submitted after ``since`` (a job number
    the qmaster gave before, in an earlier life of the cluster, is not counted)."""
    after = int(since.timestamp() - 1) * 1_000_000

    def done() -> bool:
        tasks = Task.objects.filter(campaign_id__in=campaign_ids)
        if tasks.filter(teardown_done_at__isnull=True).exists():
            return False
        wanted = {(c.job_number, c.task_count) for c in Campaign.objects.filter(pk__in=campaign_ids)}
        wanted |= {(j, Task.objects.filter(job_number=j).count()) for j in jobs}
        return all(AccountingRecord.objects.filter(job_number=j, submission_us__gte=after)
                   .values("task_number").distinct().count() >= n
                   for j, n in wanted)
    return done
