"""tco's data: clusters, teams, agent definitions, campaigns, tasks, accounting.

Terms follow DESIGN.md. A ``Task`` is one scheduler task (job_number,
task_number); its ``state`` is a lifecycle word of DESIGN.md. Tasks that are
not terminal are ``active``; among active tasks (cluster, job_number,
task_number) is unique, since job numbers wrap only after millions of jobs
while a task is alive. ``task_number`` is 0 for a non-array job, as in the
accounting file.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q

from schedulers.base import LIFECYCLE_STATES

STATE_CHOICES = [(s, s) for s in LIFECYCLE_STATES]


class Cluster(models.Model):
    """One Grid Engine cell and how to reach it."""

    FLAVOURS = [("sge8", "Son of Grid Engine 8"), ("ocs9", "Open/Gridware Cluster Scheduler 9")]

    name = models.SlugField(unique=True)
    sge_root = models.CharField(max_length=255)
    sge_cell = models.CharField(max_length=64, default="default")
    accounting_path = models.CharField(max_length=255)
    flavour = models.CharField(max_length=8, choices=FLAVOURS, default="sge8")
    time_zone = models.CharField(max_length=64, default="UTC")
    # Latest queue summary, hosts and quotas (JSON from the parsers), polled every few seconds.
    status = models.JSONField(default=dict, blank=True)
    status_at = models.DateTimeField(null=True, blank=True)
    polled_at = models.DateTimeField(null=True, blank=True)
    poll_error = models.TextField(blank=True)
    poll_error_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class IngestCheckpoint(models.Model):
    """Where the incremental read of a file stopped: (inode, byte offset, fingerprint of its first bytes)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    source = models.CharField(max_length=32)  # "accounting"
    path = models.CharField(max_length=255)
    inode = models.BigIntegerField(default=0)
    offset = models.BigIntegerField(default=0)
    # "<n>:<sha256>" of the file's first n bytes (schedulers/accounting_cursor.py): a file truncated
    # and regrown past the offset has other first bytes.
    fingerprint = models.CharField(max_length=80, blank=True, default="")
    accepted = models.BigIntegerField(default=0)
    quarantined = models.BigIntegerField(default=0)
    resets = models.IntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "source"], name="one_checkpoint_per_source")]


class Team(models.Model):
    """A group of users mapped to one scheduler project (``-P``)."""

    name = models.CharField(max_length=64, unique=True)
    project = models.CharField(max_length=64, unique=True)
    group = models.OneToOneField(Group, on_delete=models.PROTECT, related_name="team")

    def __str__(self) -> str:
        return self.name


class AgentDefinition(models.Model):
    """A named, versioned thing to run (DESIGN.md, objects)."""

    INPUT_KINDS = [("params", "parameter set"), ("jsonl", "line of a JSONL file"), ("file", "file")]

    name = models.SlugField()
    version = models.PositiveIntegerField(default=1)
    description = models.TextField(blank=True)
    # argv list; "{input}" and "{workdir}" are replaced by the runner.
    command = models.JSONField()
    default_policy = models.TextField(blank=True)
    default_model = models.CharField(max_length=128, blank=True)
    input_kind = models.CharField(max_length=8, choices=INPUT_KINDS, default="params")
    timeout_s = models.PositiveIntegerField(default=3600)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="agent_name_version")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class Campaign(models.Model):
    """One launch of an agent definition: one array job of ``task_count`` tasks."""

    STATUS = [
        ("submitting", "submitting"),
        ("submitted", "submitted"),
        ("rejected", "rejected by the scheduler"),
        ("finished", "finished"),
    ]

    name = models.CharField(max_length=100)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT)
    team = models.ForeignKey(Team, on_delete=models.PROTECT)
    agent_definition = models.ForeignKey(AgentDefinition, on_delete=models.PROTECT)
    launched_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    queue = models.CharField(max_length=64)
    task_count = models.PositiveIntegerField()
    seats_per_task = models.PositiveSmallIntegerField(default=1)
    concurrency_cap = models.PositiveIntegerField(null=True, blank=True)
    priority = models.SmallIntegerField(default=0)
    urgent = models.BooleanField(default=False)
    # Launch options (validated by services.campaign_launch before anything is written).
    model = models.CharField(max_length=128, blank=True)
    policy = models.TextField(blank=True, help_text="sandbox policy YAML (OpenShell schema)")
    predecessor_job = models.PositiveIntegerField(null=True, blank=True, help_text="-hold_jid_ad")
    advance_reservation = models.PositiveIntegerField(null=True, blank=True, help_text="-ar")
    token_cap = models.PositiveBigIntegerField(null=True, blank=True, help_text="tokens per task")
    cost_cap_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                       help_text="USD per task")
    submit_on_hold = models.BooleanField(default=False)
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    status = models.CharField(max_length=12, choices=STATUS, default="submitting")
    submit_error = models.TextField(blank=True)
    # Stage "submit": launch request accepted -> the DRMAA call returned the job ids.
    launched_at = models.DateTimeField()
    submitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    job_number = models.PositiveIntegerField(null=True, blank=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def submit_seconds(self) -> float | None:
        if self.submitted_at is None:
            return None
        return (self.submitted_at - self.launched_at).total_seconds()


class TokenUsage(models.Model):
    """Token counts in DESIGN.md's disjoint buckets (reasoning is part of output) and their cost in USD.

    ``cost_usd`` is None when any of the tokens has no price (never 0 by default).
    """

    input_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_5m_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_1h_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    reasoning_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)

    class Meta:
        abstract = True


class Task(TokenUsage):
    """One scheduler task, with its lifecycle state, accounting and stages (and, from TokenUsage, its tokens)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.CASCADE, related_name="tasks")
    job_number = models.PositiveIntegerField()
    task_number = models.PositiveIntegerField(default=0)
    is_array = models.BooleanField(default=False)
    name = models.CharField(max_length=255, blank=True)
    owner = models.CharField(max_length=64, blank=True)
    project = models.CharField(max_length=64, blank=True)
    queue = models.CharField(max_length=64, blank=True)
    host = models.CharField(max_length=255, blank=True)
    slots = models.PositiveIntegerField(default=1)
    priority = models.FloatField(default=0)
    state = models.CharField(max_length=10, choices=STATE_CHOICES, default="pending", db_index=True)
    state_code = models.CharField(max_length=16, blank=True)
    restarted = models.BooleanField(default=False)
    active = models.BooleanField(default=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    first_seen_at = models.DateTimeField(null=True, blank=True)
    gone_at = models.DateTimeField(null=True, blank=True)
    # From the accounting record.
    wallclock_s = models.FloatField(null=True, blank=True)
    cpu_s = models.FloatField(null=True, blank=True)
    maxvmem_bytes = models.FloatField(null=True, blank=True)
    failed_code = models.IntegerField(null=True, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    # Stages from the runner record (UTC).
    task_started_at = models.DateTimeField(null=True, blank=True)
    sandbox_create_at = models.DateTimeField(null=True, blank=True)
    sandbox_ready_at = models.DateTimeField(null=True, blank=True)
    agent_started_at = models.DateTimeField(null=True, blank=True)
    agent_exited_at = models.DateTimeField(null=True, blank=True)
    teardown_done_at = models.DateTimeField(null=True, blank=True)
    runner_record = models.JSONField(null=True, blank=True)
    usage_flags = models.JSONField(default=list, blank=True)
    verdict = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "job_number", "task_number"],
                condition=Q(active=True),
                name="one_active_task_per_id",
            ),
        ]
        indexes = [
            models.Index(fields=["campaign", "state"]),
            models.Index(fields=["cluster", "job_number", "task_number"]),
            models.Index(fields=["campaign", "task_number"]),
        ]

    def __str__(self) -> str:
        return self.task_id

    @property
    def task_id(self) -> str:
        """``job.task`` as Grid Engine writes it (``job`` for a non-array job)."""
        return f"{self.job_number}.{self.task_number}" if self.is_array else str(self.job_number)

    @property
    def queue_wait_s(self) -> float | None:
        start = self.task_started_at or self.started_at
        if self.submitted_at is None or start is None:
            return None
        return (start - self.submitted_at).total_seconds()


class TaskEvent(models.Model):
    """A state change of a task, as seen by a poll or an ingest."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    from_state = models.CharField(max_length=10, blank=True)
    to_state = models.CharField(max_length=10)
    state_code = models.CharField(max_length=16, blank=True)


class AccountingRecord(models.Model):
    """One accounting record, upserted on DESIGN.md's identity."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, db_index=False)  # see Meta
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="accounting")
    job_number = models.PositiveIntegerField()
    task_number = models.PositiveIntegerField(default=0)
    pe_taskid = models.CharField(max_length=64, default="", blank=True)
    # The identity's times as integers (microseconds since the epoch, 0 where
    # the file says 0): NULLs never compare equal in a unique index, so a
    # re-read failed-start record would otherwise be stored twice.
    submission_us = models.BigIntegerField()
    start_us = models.BigIntegerField()
    end_us = models.BigIntegerField()
    submitted_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    ended_at = models.DateTimeField(null=True)
    job_name = models.CharField(max_length=255)
    owner = models.CharField(max_length=64)
    group = models.CharField(max_length=64)
    project = models.CharField(max_length=64, blank=True)
    department = models.CharField(max_length=64, blank=True)
    account = models.CharField(max_length=255, blank=True)
    queue = models.CharField(max_length=64)
    hostname = models.CharField(max_length=255)
    slots = models.PositiveIntegerField(default=1)
    wallclock_s = models.FloatField()
    cpu_s = models.FloatField()
    maxvmem_bytes = models.FloatField()
    failed = models.IntegerField()
    exit_status = models.IntegerField()
    category = models.TextField(blank=True)
    usage = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us"],
                name="accounting_identity",
            ),
        ]
        # The identity constraint's index starts with (cluster, job_number, task_number):
        # it serves those lookups, so no other index repeats that prefix (each costs ingest speed).
        indexes = [models.Index(fields=["ended_at"])]


class QuarantinedLine(models.Model):
    """An accounting line that could not be read; kept whole, never ingested shifted."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    path = models.CharField(max_length=255)
    inode = models.BigIntegerField()
    offset = models.BigIntegerField()
    raw = models.BinaryField()
    reason = models.CharField(max_length=255)
    seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "inode", "offset"], name="quarantine_once")]


class ModelRequest(TokenUsage):
    """One model API request as the metering proxy saw it (from the runner record)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="requests")
    seq = models.PositiveIntegerField()
    at = models.DateTimeField()
    provider = models.CharField(max_length=32, blank=True)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    status = models.PositiveSmallIntegerField()
    requested_model = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=128, blank=True)
    complete = models.BooleanField(default=True)
    latency_ms = models.FloatField(null=True, blank=True)
    flags = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "seq"], name="one_request_per_seq")]


class Role(models.TextChoices):
    """What a user may do; each role includes the ones before it, admin includes all.

    ``lead`` (team lead) reads bills and sets budgets; ``launcher`` launches
    campaigns; ``urgent`` (urgent launcher) also launches urgent agents.
    """

    VIEWER = "viewer", "viewer"
    LEAD = "lead", "team lead"
    LAUNCHER = "launcher", "launcher"
    URGENT = "urgent", "urgent launcher"


class Membership(models.Model):
    """A user's role in one team (the team's Django group holds the same users)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_role_per_team")]


class Budget(models.Model):
    """A team's spending limit per period, with alert thresholds (fractions of ``amount_usd``)."""

    PERIODS = [("day", "day"), ("week", "week"), ("month", "month")]
    ON_EXCEED = [("refuse", "refuse the launch"), ("hold", "submit on hold")]

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budgets")
    period = models.CharField(max_length=5, choices=PERIODS, default="month")
    amount_usd = models.DecimalField(max_digits=12, decimal_places=2)
    thresholds = models.JSONField(default=list, help_text="e.g. [0.5, 0.8, 1.0]")
    on_exceed = models.CharField(max_length=6, choices=ON_EXCEED, default="refuse")
    alert_emails = models.TextField(blank=True, help_text="one address per line")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "period"], name="one_budget_per_period")]


class BudgetAlert(models.Model):
    """A threshold crossed in one period; sent once."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateField()
    threshold = models.DecimalField(max_digits=5, decimal_places=3)
    spent_usd = models.DecimalField(max_digits=14, decimal_places=6)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["budget", "period_start", "threshold"], name="alert_once")]


class AuditEntry(models.Model):
    """Every launch and control action: who, what, when, result."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=32)
    target = models.CharField(max_length=128, blank=True)
    params = models.JSONField(default=dict, blank=True)
    ok = models.BooleanField()
    result = models.TextField(blank=True)


from .pricing_models import ModelAlias, ModelPrice  # noqa: E402,F401  (price table, issue 5)
