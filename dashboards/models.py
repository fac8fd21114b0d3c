"""tco's data: clusters, teams, agent definitions, campaigns, tasks, accounting.

Terms follow DESIGN.md. A ``Task`` is one scheduler task (job_number,
task_number); its ``state`` is a lifecycle word of DESIGN.md. Tasks that are
not terminal are ``active``; among active tasks (cluster, job_number,
task_number) is unique, since job numbers wrap only after millions of jobs
while a task is alive. ``task_number`` is 0 for a non-array job, as in the
accounting file.

The app's other models live in sibling ``*_models.py`` modules (a team's members and budgets,
the audit log and control requests, prices, API tokens, reservations, alerts, rollups), imported
at the bottom so that they belong to the app: every model is imported from here. The choices
and state tables beside them (``Role``, ``ControlState``, ``CONTROL_TRANSITIONS``) are imported
from their own module.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
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
    # The cell's ports where they are not /etc/services' (a second cell on the same machines): its
    # clients and libdrmaa get them as SGE_QMASTER_PORT / SGE_EXECD_PORT (docs/clusters.md).
    qmaster_port = models.PositiveIntegerField(null=True, blank=True)
    execd_port = models.PositiveIntegerField(null=True, blank=True)
    # Latest queue summary, hosts and quotas (JSON from the parsers), polled every few seconds.
    status = models.JSONField(default=dict, blank=True)
    status_at = models.DateTimeField(null=True, blank=True)
    polled_at = models.DateTimeField(null=True, blank=True)
    # When the qstat of the last applied poll began and when it answered: a snapshot is applied only
    # if its qstat began after the last applied one answered, so the snapshots applied follow each
    # other in the scheduler's time (dashboards.ingest.poll.apply_qstat_poll; two pollers racing).
    poll_observed_at = models.DateTimeField(null=True, blank=True)
    poll_answered_at = models.DateTimeField(null=True, blank=True)
    poll_error = models.TextField(blank=True)
    poll_error_at = models.DateTimeField(null=True, blank=True)
    # The last accounting ingest's failure (missing or unreadable file); "" once a pass reads the file.
    accounting_error = models.TextField(blank=True)
    accounting_error_at = models.DateTimeField(null=True, blank=True)
    # Detail rows (tasks, requests, accounting records) of usage that ended before this were dropped
    # (TCO_DETAIL_RETENTION_DAYS, dashboards.ingest.retention); the rollups hold what bills need of them.
    detail_dropped_before = models.DateTimeField(null=True, blank=True)

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


class Install(models.Model):
    """This install's identity, one row (pk 1): the id its Grid Engine job names carry.

    ``install_id``: 8 of ``[a-z0-9]``, made when the database was migrated (migration 0025) or, if
    the row is missing, by the first process that needs it (``dashboards.core.install``); the
    setting ``TCO_INSTALL_ID`` wins over it. ``created_at``: when the row was made; campaigns
    launched before it were submitted under the old job name ``tco-c<id>-<name>``
    (``launch.submit.find_campaign_job``).
    """

    install_id = models.CharField(max_length=12, validators=[RegexValidator(r"^[a-z0-9]{3,12}$")])
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.install_id


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


class CampaignStatus(models.TextChoices):
    """A campaign's state; the allowed moves are :data:`CAMPAIGN_TRANSITIONS`.

    ``submitting`` covers both "waiting for the submit worker" and "claimed by
    one" (``Campaign.submit_claimed_at`` set): the job number is committed in
    the same update that moves it to ``submitted``. Once submitted, ingest
    moves it between ``submitted`` (every unfinished task waits), ``running``
    (at least one task runs or is finishing), ``paused`` (none runs, and every
    waiting task is held by tco: its launcher, an admin or a budget) and ``waiting``
    (none runs, and every waiting task waits for its ``-hold_jid_ad`` predecessor's
    task, which no release moves; ``control.waits_for_predecessor``), and to
    ``finished`` when no task is active (``ingest.campaign_status_follow``).
    """

    SUBMITTING = "submitting", "submitting"
    SUBMITTED = "submitted", "submitted (waiting)"
    RUNNING = "running", "running"
    PAUSED = "paused", "paused (held)"
    WAITING = "waiting", "waiting for its predecessor"
    REJECTED = "rejected", "rejected by the scheduler"
    FINISHED = "finished", "finished"


#: The states of a campaign whose job is in the scheduler (submitted and not finished).
CAMPAIGN_LIVE = (CampaignStatus.SUBMITTED, CampaignStatus.RUNNING, CampaignStatus.PAUSED, CampaignStatus.WAITING)


#: Campaign state -> the states it may move to (services.campaign_submit, the reconciler, ingest).
CAMPAIGN_TRANSITIONS: dict[str, frozenset[str]] = {
    CampaignStatus.SUBMITTING: frozenset({CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTED,
                                          CampaignStatus.REJECTED}),
    CampaignStatus.SUBMITTED: frozenset({CampaignStatus.RUNNING, CampaignStatus.PAUSED, CampaignStatus.WAITING,
                                         CampaignStatus.FINISHED}),
    CampaignStatus.RUNNING: frozenset({CampaignStatus.SUBMITTED, CampaignStatus.PAUSED, CampaignStatus.WAITING,
                                       CampaignStatus.FINISHED}),
    CampaignStatus.PAUSED: frozenset({CampaignStatus.SUBMITTED, CampaignStatus.RUNNING, CampaignStatus.WAITING,
                                      CampaignStatus.FINISHED}),
    CampaignStatus.WAITING: frozenset({CampaignStatus.SUBMITTED, CampaignStatus.RUNNING, CampaignStatus.PAUSED,
                                       CampaignStatus.FINISHED}),
    CampaignStatus.REJECTED: frozenset(),
    CampaignStatus.FINISHED: frozenset(),
}


def transition(queryset, *, field: str, transitions: dict[str, frozenset[str]], source, target: str,
               **changes) -> int:
    """Move the rows of ``queryset`` whose ``field`` is in ``source`` (one state or several) to
    ``target``, with ``changes``, in one conditional UPDATE; return how many moved.

    The only way tco changes these states: a move not in ``transitions`` raises ValueError
    before anything is written, and a row that is no longer in ``source`` is left alone (so a
    duplicated delivery acts once).
    """
    sources = (source,) if isinstance(source, str) else tuple(source)
    for s in sources:
        if target not in transitions[s]:
            raise ValueError(f"{field}: {s} -> {target} is not an allowed transition")
    return queryset.filter(**{f"{field}__in": sources}).update(**{field: target}, **changes)


class Campaign(models.Model):
    """One launch of an agent definition: one array job of ``task_count`` tasks."""

    Status = CampaignStatus
    STATUS = CampaignStatus.choices

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
    # Launch options (validated by dashboards.launch before anything is written).
    model = models.CharField(max_length=128, blank=True)
    policy = models.TextField(blank=True, help_text="sandbox policy YAML (OpenShell schema)")
    predecessor_job = models.PositiveIntegerField(null=True, blank=True, help_text="-hold_jid_ad")
    advance_reservation = models.PositiveIntegerField(null=True, blank=True, help_text="-ar")
    token_cap = models.PositiveBigIntegerField(null=True, blank=True, help_text="tokens per task")
    cost_cap_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                       help_text="USD per task")
    submit_on_hold = models.BooleanField(default=False)
    rerunnable = models.BooleanField(default=False, help_text="-r y: rerun a task elsewhere if its host is lost")
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    status = models.CharField(max_length=12, choices=CampaignStatus.choices, default=CampaignStatus.SUBMITTING)
    submit_error = models.TextField(blank=True)
    # The submission claim (services.campaign_submit): set while a worker is between its claim and
    # the commit of the job number; a claim that outlives its worker is settled by the reconciler.
    submit_claimed_at = models.DateTimeField(null=True, blank=True)
    submit_claimed_by = models.CharField(max_length=128, blank=True, help_text="host:pid of the claiming worker")
    submit_attempts = models.PositiveSmallIntegerField(default=0)
    # The array job's name, fixed by the first claim (launch.submit.campaign_job_name): a later claim or the
    # reconciler looks for the job under this name even if the install id or the campaign name changed since.
    job_name = models.CharField(max_length=64, blank=True)
    # Stage "submit": launch request accepted -> the DRMAA call returned the job ids.
    launched_at = models.DateTimeField()
    submitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    job_number = models.PositiveIntegerField(null=True, blank=True, db_index=True)
    # The launch forecast as it stood at launch (dashboards.launch.forecast_record), None for a
    # campaign launched before forecasts were kept.
    forecast = models.JSONField(null=True, blank=True, help_text="the launch forecast at launch (launch.forecast_record)")

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
    # OCS 9 flexible accounting: the accounting record's token totals checked against the runner
    # record's (dashboards.ingest.accounting.check_accounting_tokens); None until both are read.
    accounting_check = models.JSONField(null=True, blank=True)
    verdict = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "job_number", "task_number"],
                condition=Q(active=True),
                name="one_active_task_per_id",
            ),
            # A campaign is one array job: task N of it is one row, whatever order polls, accounting
            # records and runner records come in (issue 23, finding 11; dashboards.ingest).
            models.UniqueConstraint(
                fields=["campaign", "task_number"],
                condition=Q(campaign__isnull=False),
                name="one_row_per_campaign_task",
            ),
        ]
        indexes = [
            models.Index(fields=["campaign", "state"]),
            models.Index(fields=["cluster", "job_number", "task_number"]),
            models.Index(fields=["campaign", "task_number"]),
            # Bills: the tasks that started in a range (the edges of hours the rollups do not cover, and
            # the detail path), and the active ones among them (never in the rollups: few, the live queue).
            models.Index(fields=["cluster", "started_at"], name="task_started"),
            models.Index(fields=["cluster", "started_at"], condition=Q(active=True), name="task_active_started"),
            # A campaign's costliest tasks, page by page (billing.bill_page.costliest_tasks).
            models.Index(fields=["campaign", "-cost_usd", "task_number"], condition=Q(cost_usd__isnull=False),
                         name="task_costliest"),
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
        # tco's submission time (DRMAA returned) can follow the qmaster's start: never negative.
        return max((start - self.submitted_at).total_seconds(), 0.0)


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
    # What qacct sums and the bill uses: SGE 8 ``ru_wallclock``; OCS 9 ``usage.rusage.ru_wallclock``
    # (whole seconds). ``wallclock_exact_s``: OCS 9 ``usage.eusage.wallclock`` (else end - start), None on SGE 8.
    wallclock_s = models.FloatField()
    wallclock_exact_s = models.FloatField(null=True, blank=True)
    cpu_s = models.FloatField()
    maxvmem_bytes = models.FloatField()
    failed = models.IntegerField()
    exit_status = models.IntegerField()
    category = models.TextField(blank=True)
    usage = models.JSONField(default=dict, blank=True)
    # Token totals per bucket from ``usage.tco`` (``tco_<bucket>`` lines the usage epilog put in the
    # job's usage file; OCS 9 ``reporting_params usage_patterns=tco:tco_*``), tokens; {} without them.
    tokens = models.JSONField(default=dict, blank=True)

    class Meta:
        # The identity (DESIGN.md) plus the execution host: a job that fails to start (``failed`` 28,
        # start and end 0) writes one record per host it was tried on, equal in every other part;
        # without the host the second was taken for a re-read of the first and dropped (the fault
        # tests found 4 such records lost on the 3-host dev cluster).
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us",
                        "hostname"],
                name="accounting_identity_host",
            ),
        ]
        # The identity constraint's index starts with (cluster, job_number, task_number):
        # it serves those lookups, so no other index repeats that prefix (each costs ingest speed).
        indexes = [models.Index(fields=["ended_at"]),
                   models.Index(fields=["cluster", "started_at"], name="accounting_started")]


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

    # No index of its own: the (task, seq) constraint's index serves every lookup by task.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="requests", db_index=False)
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


#: Endpoint, provider and credential names as the spool contract accepts them.
_ENDPOINT_NAME = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", "1-64 letters, digits, '_', '.', '-'")


def _root_prefix() -> list[str]:
    return ["/"]


class ModelEndpoint(models.Model):
    """A model API endpoint the site registered (admin): the only places a credential is sent.

    The launch writes the endpoints a campaign may use into the runner spec
    (``model_endpoints``); ``credential_name`` is a name in the runners'
    credentials file, never the secret.
    """

    SCHEMES = [("http", "http"), ("https", "https")]

    name = models.CharField(max_length=64, unique=True, validators=[_ENDPOINT_NAME])
    provider = models.CharField(max_length=64, validators=[_ENDPOINT_NAME],
                                help_text="the credential_binding provider a policy names (anthropic, openai, ...)")
    scheme = models.CharField(max_length=5, choices=SCHEMES, default="https")
    host = models.CharField(max_length=253, validators=[RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$",
                                                                        "a host name or address")])
    port = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(65535)])
    path_prefixes = models.JSONField(default=_root_prefix, help_text='paths the endpoint serves, e.g. ["/v1/"]')
    credential_name = models.CharField(max_length=64, validators=[_ENDPOINT_NAME],
                                       help_text="name in the runners' credentials file")
    active = models.BooleanField(default=True)

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        prefixes = self.path_prefixes
        if not isinstance(prefixes, list) or not prefixes or not all(
                isinstance(p, str) and p.startswith("/") and not any(c in p for c in "\0\r\n?#") for p in prefixes):
            raise ValidationError({"path_prefixes": 'a non-empty list of paths starting with "/", e.g. ["/v1/"]'})

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host", "port"], name="one_endpoint_per_host_port")]

    def __str__(self) -> str:
        return f"{self.name} ({self.scheme}://{self.host}:{self.port})"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def spec_entry(self) -> dict:
        """The entry of the runner spec's ``model_endpoints`` list."""
        return {"name": self.name, "provider": self.provider, "scheme": self.scheme, "host": self.host,
                "port": self.port, "path_prefixes": list(self.path_prefixes or []),
                "credential_name": self.credential_name}


class PolicyCeiling(models.Model):
    """The most a campaign's sandbox policy may allow, for one team or one agent definition (admin).

    ``policy`` is YAML in the runner's policy schema (execution/sandbox/policy/);
    a campaign's policy may only narrow it (execution/sandbox/ceiling.py). Where
    both a team's and an agent definition's ceiling exist, the policy must fit
    both. Without any, the runner's default policy is the ceiling.
    """

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="ceilings")
    agent_definition = models.ForeignKey(AgentDefinition, null=True, blank=True, on_delete=models.CASCADE,
                                         related_name="ceilings")
    policy = models.TextField(help_text="sandbox policy YAML: the widest policy allowed")
    note = models.CharField(max_length=255, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(team__isnull=False, agent_definition__isnull=True)
                           | Q(team__isnull=True, agent_definition__isnull=False)),
                name="ceiling_for_team_or_agent"),
            models.UniqueConstraint(fields=["team"], condition=Q(team__isnull=False), name="one_ceiling_per_team"),
            models.UniqueConstraint(fields=["agent_definition"], condition=Q(agent_definition__isnull=False),
                                    name="one_ceiling_per_agent"),
        ]

    def __str__(self) -> str:
        return f"ceiling for {self.team or self.agent_definition}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from execution.sandbox.policy.load import load_policy
        from execution.sandbox.policy.model import PolicyError

        try:
            load_policy(self.policy)
        except PolicyError as exc:
            raise ValidationError({"policy": "; ".join(exc.problems)}) from None


from dashboards.team_models import Budget, BudgetAlert, Membership  # noqa: E402,F401  (members, budgets)
from dashboards.control_models import AuditEntry, ControlRequest  # noqa: E402,F401  (audit log, control requests)
from dashboards.pricing_models import ModelAlias, ModelPrice  # noqa: E402,F401  (price table, issue 5)
from dashboards.token_models import ApiToken  # noqa: E402,F401  (API tokens, hashed; issue 11)
from dashboards.reservation_models import Reservation  # noqa: E402,F401  (advance reservations booked from tco; issue 17)
from dashboards.alert_models import AnomalyAlert  # noqa: E402,F401  (anomaly alerts; issue 25)
from dashboards.rollup_models import (  # noqa: E402,F401  (usage per hour kept at ingest; issue 26)
    RequestRollup, UsageRollup, WasteRollup)
