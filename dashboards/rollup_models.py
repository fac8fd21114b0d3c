"""Usage rolled up per hour at ingest (issue 26): what bills sum, kept beside the detail rows.

One ``UsageRollup`` row holds, for one cluster, one UTC hour (of the usage's
start, as bills count it), one campaign and one queue, the sums a bill adds:

* from accounting records (every record, as ``qacct`` counts them):
  ``records``, ``wallclock_us`` and ``slot_us`` (wall clock and wall clock x
  slots, in integer microseconds, so sums are exact);
* from the tasks of tco's campaigns once they ended (``Task.active`` False):
  ``tasks``, ``finished_tasks``, ``verdicts``, ``unpriced_tasks``, the token
  buckets and ``cost_units`` (integer 1e-8 USD, ``Task.cost_usd``'s own
  precision).

``campaign_id`` 0 is usage tco did not launch; its ``project`` is the
accounting record's. A tco campaign's team, model and launcher are read from
the campaign itself when a bill groups by them (``project`` is ""), so a
bill per team, campaign, model or launcher sums the same rows.

The rows are written in the transaction that writes the detail rows
(``dashboards.core.rollups``); the tasks still active are read from the
detail rows when a bill is made, so a bill over the rollups equals one over
the detail rows at every commit.

``WasteRollup`` holds what the waste view (``billing.waste``) sums, per
hour, campaign, the task's end state and verdict: kept per verdict, so the
failing verdicts (a setting, ``TCO_FAILING_VERDICTS``) are applied when the
view is made, over retained hours too; and per ``infrastructure``, whether
tco's infrastructure failed the task (``core.failures``: a lost host, the
scheduler, tco's runner or its metering proxy), which the view shows apart
from the team's waste. That one is decided when the row is written, from the
task's end state, accounting codes and runner record (``rollup_sql.
infrastructure_sql``), as ``core.failures.failure_of`` decides it.

``RequestRollup`` counts the metered model requests of ended tasks per
hour (of the task's start), campaign, provider and model: the FOCUS export
names each campaign's providers from it, not from every request row.

Imported by dashboards/models.py, so the model belongs to the ``dashboards`` app.
"""
from __future__ import annotations

from django.db import models

#: The sums of a rollup row, in the order of ``dashboards.core.rollups``.
TASK_SUMS = ("tasks", "finished_tasks", "verdicts", "unpriced_tasks", "cost_units", "input_tokens",
             "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens", "output_tokens",
             "reasoning_tokens")
RECORD_SUMS = ("records", "wallclock_us", "slot_us")
SUMS = (*TASK_SUMS, *RECORD_SUMS)
KEY = ("cluster_id", "hour", "campaign_id", "project", "queue")
#: The sums of a waste rollup row (``WasteRollup``): from ended tasks, then from their accounting records.
WASTE_TASK_SUMS = ("tasks", "unpriced_tasks", "cost_units")
WASTE_RECORD_SUMS = ("records", "wallclock_us", "slot_us")
WASTE_SUMS = (*WASTE_TASK_SUMS, *WASTE_RECORD_SUMS)
WASTE_KEY = ("cluster_id", "hour", "campaign_id", "state", "verdict", "infrastructure", "earlier")
#: The key and sums of a model-request rollup row (``RequestRollup``).
REQUEST_KEY = ("cluster_id", "hour", "campaign_id", "provider", "model")
REQUEST_SUMS = ("requests",)


class HourRollup(models.Model):
    """The key columns every rollup starts with: one ``cluster``, one UTC ``hour`` (its start) and one
    campaign (``campaign_id``, its id). Abstract: each rollup is a table of its own.

    ``cluster`` has no index of its own: each rollup's unique key starts with (cluster, hour) and
    serves it. A rollup restates ``hour`` or ``campaign_id`` only where its column's help text or
    default differs (they are part of the migrations' state). ``str()`` names the key: these three
    columns, then the rollup's ``KEY_REST``.
    """

    #: The rollup's other key columns that ``str()`` names after (cluster, hour, campaign).
    KEY_REST: tuple[str, ...] = ()

    cluster = models.ForeignKey("dashboards.Cluster", on_delete=models.CASCADE, db_index=False)  # the key serves it
    hour = models.DateTimeField(help_text="start of the UTC hour the task started in")
    campaign_id = models.BigIntegerField()

    class Meta:
        abstract = True
        app_label = "dashboards"

    def __str__(self) -> str:
        rest = " ".join(str(getattr(self, name)) for name in self.KEY_REST)
        return f"{self.cluster_id} {self.hour:%Y-%m-%d %H}h campaign {self.campaign_id} {rest}"


class UsageSums(models.Model):
    """The sums of a usage rollup row, hour or day (:data:`SUMS`; integer microseconds, USD x 1e8)."""

    tasks = models.BigIntegerField(default=0)
    finished_tasks = models.BigIntegerField(default=0)
    verdicts = models.BigIntegerField(default=0)
    unpriced_tasks = models.BigIntegerField(default=0)
    cost_units = models.BigIntegerField(default=0, help_text="USD x 1e8")
    input_tokens = models.BigIntegerField(default=0)
    cache_read_tokens = models.BigIntegerField(default=0)
    cache_write_5m_tokens = models.BigIntegerField(default=0)
    cache_write_1h_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    records = models.BigIntegerField(default=0)
    wallclock_us = models.BigIntegerField(default=0)
    slot_us = models.BigIntegerField(default=0)

    class Meta:
        abstract = True
        app_label = "dashboards"


class WasteColumns(models.Model):
    """A waste rollup row's end state, verdict, infrastructure and earlier-attempt columns and its sums
    (:data:`WASTE_SUMS`), hour or day."""

    state = models.CharField(max_length=10, help_text="the task's end state")
    verdict = models.CharField(max_length=64, blank=True, help_text="the task's verdict, where it ended done")
    # db_default: a writer that names no such column (0022's backfill, code older than 0024) writes False.
    infrastructure = models.BooleanField(default=False, db_default=False,
                                         help_text="tco's infrastructure failed the task (core.failures)")
    earlier = models.BooleanField(default=False, help_text="records of an earlier attempt of the task")
    tasks = models.BigIntegerField(default=0)
    unpriced_tasks = models.BigIntegerField(default=0)
    cost_units = models.BigIntegerField(default=0, help_text="USD x 1e8")
    records = models.BigIntegerField(default=0)
    wallclock_us = models.BigIntegerField(default=0)
    slot_us = models.BigIntegerField(default=0)

    class Meta:
        abstract = True
        app_label = "dashboards"


class UsageRollup(HourRollup, UsageSums):
    """The usage that started in one UTC hour on one cluster, of one campaign (0: not tco's) and queue."""

    KEY_REST = ("project", "queue")

    hour = models.DateTimeField(help_text="start of the UTC hour the usage started in")
    campaign_id = models.BigIntegerField(default=0, help_text="0: usage tco did not launch")
    project = models.CharField(max_length=64, blank=True, help_text="the record's project where campaign_id is 0")
    queue = models.CharField(max_length=64, blank=True)

    class Meta(HourRollup.Meta):
        # The key's index starts with (cluster, hour): it serves every bill's range of hours.
        constraints = [models.UniqueConstraint(fields=["cluster", "hour", "campaign_id", "project", "queue"],
                                               name="one_rollup_per_key")]
        # One team's bill: its campaigns' hours, and the hours of its project's jobs tco did not launch.
        indexes = [models.Index(fields=["campaign_id", "project", "hour"], name="rollup_campaign_hour")]


class WasteRollup(HourRollup, WasteColumns):
    """What the ended tasks of one campaign that started in one UTC hour on one cluster, in one end
    state (``Task.state``) with one verdict (only for ``done``; "" otherwise), failed by tco's
    infrastructure or not (``infrastructure``, ``core.failures``), used: ``tasks``,
    ``unpriced_tasks`` (tokens, no cost) and ``cost_units`` (USD x 1e8) from the tasks (by their
    start), ``records``, ``wallclock_us`` and ``slot_us`` (integer microseconds) from their
    accounting records (by each record's own start); ``earlier`` True: records of an attempt before
    the task's last (a later record of the same task exists), which carry no task sums.

    Written with the detail rows (``dashboards.core.rollups``: ``tasks_rolled``, ``tasks_added``,
    and ``core.bulk.store_accounting_records`` for records of tco's tasks); tasks still active and
    their records are read from the detail rows, as bills do."""

    KEY_REST = ("state", "verdict")

    hour = models.DateTimeField(help_text="start of the UTC hour the task (or the record) started in")

    class Meta(HourRollup.Meta):
        # The key's index starts with (cluster, hour): every team's range of hours (an admin's view).
        constraints = [models.UniqueConstraint(fields=["cluster", "hour", "campaign_id", "state", "verdict",
                                                       "infrastructure", "earlier"],
                                               name="one_waste_rollup_per_key")]
        # One team's (or one campaign's) view: its campaigns' hours.
        indexes = [models.Index(fields=["campaign_id", "hour"], name="waste_rollup_campaign_hour")]


class RequestRollup(HourRollup):
    """The metered model requests (``ModelRequest``) of the ended tasks of one campaign that started in
    one UTC hour on one cluster, per provider and model (the model the provider returned): ``requests``.
    Kept with the detail rows as :class:`WasteRollup` is (``dashboards.core.rollups``)."""

    KEY_REST = ("provider", "model")

    provider = models.CharField(max_length=32, blank=True)
    model = models.CharField(max_length=128, blank=True)
    requests = models.BigIntegerField(default=0)

    class Meta(HourRollup.Meta):
        constraints = [models.UniqueConstraint(fields=["cluster", "hour", "campaign_id", "provider", "model"],
                                               name="one_request_rollup_per_key")]
        indexes = [models.Index(fields=["campaign_id", "hour"], name="request_rollup_campaign_hour")]


# --------------------------------------------------------------------------- the day grain
#
# The same sums per UTC day (``day``: its 00:00 UTC), kept with the hour rows (``dashboards.core.rollups``:
# every write that adds to an hour row adds the same to its day's row, in the same transaction), so a day
# row always equals the sum of its 24 hour rows. A bill, the waste view or ``/api/usage/`` reads the whole
# UTC days of a range (inside each of its periods) from the day rows and the hours at either end from the
# hour rows (``dashboards.billing.grains``): a quarter is 90 day rows per key instead of 2,160 hour rows.
# UTC days, not the cluster's local ones, so the grain never depends on a setting that can change; in a zone
# whose midnight is not 00:00 UTC a period's edge hours come from the hour rows.

#: The key of a usage day row (``UsageDayRollup``): ``KEY`` with the day for the hour.
DAY_KEY = ("cluster_id", "day", "campaign_id", "project", "queue")
#: The key of a waste day row (``WasteDayRollup``).
WASTE_DAY_KEY = ("cluster_id", "day", "campaign_id", "state", "verdict", "infrastructure", "earlier")


class UsageDayRollup(UsageSums):
    """:class:`UsageRollup`'s sums per UTC day: the usage that started in one UTC day on one cluster, of
    one campaign (0: not tco's; ``project`` then the record's) and queue. Equal to the sum of the
    day's hour rows (``tco_rollups --check``); the same units (integer microseconds, 1e-8 USD)."""

    cluster = models.ForeignKey("dashboards.Cluster", on_delete=models.CASCADE, db_index=False)  # see Meta
    day = models.DateTimeField(help_text="00:00 UTC of the day the usage started in")
    campaign_id = models.BigIntegerField(default=0, help_text="0: usage tco did not launch")
    project = models.CharField(max_length=64, blank=True, help_text="the record's project where campaign_id is 0")
    queue = models.CharField(max_length=64, blank=True)

    class Meta:
        app_label = "dashboards"
        # (cluster, day, ...): every team's days (an admin's bill); (campaign, project, day): one team's.
        constraints = [models.UniqueConstraint(fields=["cluster", "day", "campaign_id", "project", "queue"],
                                               name="one_day_rollup_per_key")]
        indexes = [models.Index(fields=["campaign_id", "project", "day"], name="day_rollup_campaign_day")]

    def __str__(self) -> str:
        return f"{self.cluster_id} {self.day:%Y-%m-%d} campaign {self.campaign_id} {self.project} {self.queue}"


class WasteDayRollup(WasteColumns):
    """:class:`WasteRollup`'s sums per UTC day (per cluster, day, campaign, end state, verdict,
    infrastructure and earlier attempt); equal to the sum of the day's waste hour rows."""

    cluster = models.ForeignKey("dashboards.Cluster", on_delete=models.CASCADE, db_index=False)  # see Meta
    day = models.DateTimeField(help_text="00:00 UTC of the day the task (or the record) started in")
    campaign_id = models.BigIntegerField()

    class Meta:
        app_label = "dashboards"
        constraints = [models.UniqueConstraint(fields=["cluster", "day", "campaign_id", "state", "verdict",
                                                       "infrastructure", "earlier"],
                                               name="one_waste_day_rollup_per_key")]
        indexes = [models.Index(fields=["campaign_id", "day"], name="waste_day_rollup_campaign_day")]

    def __str__(self) -> str:
        return f"{self.cluster_id} {self.day:%Y-%m-%d} campaign {self.campaign_id} {self.state} {self.verdict}"
