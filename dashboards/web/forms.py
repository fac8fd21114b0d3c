"""Forms for bills, budgets, launching, urgent agents, triage and the agent registry.

Each form validates every field with a message that says what to write
instead; a form that is not valid submits nothing and is shown again with
what the user typed (an uploaded JSONL file is copied into the text box, so
it is not lost either). Choices a user may not make (another team, a
priority above the role's limit) are not offered and are refused if posted.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, validate_email
from django.forms.models import ModelChoiceIterator
from django.utils import timezone

from dashboards.billing import bills, budgets, costs, periods
from dashboards.control import actions
from dashboards.core import errors, limits, ranges
from dashboards.core.clusters import cluster_get_default, clusters_watched
from dashboards.core.errors import LaunchError
from dashboards.core.roles import teams_with
from dashboards.launch import inputs, service
from dashboards.launch import policy as launch_policy
from dashboards.launch.predecessor import check_visible
from dashboards.models import AgentDefinition, Budget, Cluster

MAX_JOB_NUMBER = limits.MAX_JOB_NUMBER


def cluster_today() -> dt.date:
    """Today's date in the default cluster's zone (the bills' days)."""
    return timezone.now().astimezone(periods.cluster_zone(periods.default_cluster())).date()


def _name_validator(value: str) -> None:
    if not limits.NAME_RE.match(value):
        raise ValidationError("1-64 letters, digits, '_', '.', '-', starting with a letter or digit "
                              "(no spaces, colons, slashes or other punctuation)")


def _model_validator(value: str) -> None:
    if value and not limits.MODEL_RE.match(value):
        raise ValidationError("1-128 letters, digits and '.', '_', '-', '/', ':', '@' (no spaces)")


class _ReadOnceChoices(ModelChoiceIterator):
    """A select's choices from its field's queryset read once per form: Django's own iterator reads
    the queryset again at each use (a select's ``required`` check, then its options: two queries per
    select and page). The queryset is the form's own copy (fields are copied per form), so a form
    shown again by a later request reads it afresh."""

    def __iter__(self):
        if self.field.empty_label is not None:
            yield ("", self.field.empty_label)
        for obj in self.queryset:  # evaluated once, then its result cache
            yield self.choice(obj)

    def __len__(self) -> int:
        return len(self.queryset) + (self.field.empty_label is not None)

    def __bool__(self) -> bool:
        return self.field.empty_label is not None or bool(self.queryset)


class ModelChoiceReadOnce(forms.ModelChoiceField):
    """A ``ModelChoiceField`` whose choices are read once per form (:class:`_ReadOnceChoices`);
    validation still looks the posted value up in the queryset."""

    iterator = _ReadOnceChoices


class BillForm(forms.Form):
    team = ModelChoiceReadOnce(queryset=None, required=False, empty_label="all my teams")
    cluster = ModelChoiceReadOnce(queryset=None, required=False, empty_label="all clusters",
                                     to_field_name="name")
    period = forms.ChoiceField(choices=[(p, p) for p in periods.PERIODS], initial="day")
    first = forms.DateField(label="from", widget=forms.DateInput(attrs={"type": "date"}))
    last = forms.DateField(label="to", widget=forms.DateInput(attrs={"type": "date"}))
    group_by = forms.ChoiceField(choices=[(g, g) for g in bills.GROUPS], initial="team", label="per")
    campaign = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)
    model = forms.CharField(required=False, max_length=128, widget=forms.HiddenInput, validators=[_model_validator])
    launcher = forms.CharField(required=False, max_length=150, widget=forms.HiddenInput)
    preset = forms.ChoiceField(required=False, choices=[("", "custom")] + [
        (k, k) for k in ("this-week", "last-week", "this-month", "last-month")], widget=forms.HiddenInput)

    def __init__(self, *args, user: AbstractBaseUser, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = bills.teams_billable_by(user).order_by("name")
        self.fields["cluster"].queryset = Cluster.objects.order_by("name")
        if self.fields["cluster"].queryset.count() < 2:  # one cluster: nothing to choose
            self.fields["cluster"].widget = forms.HiddenInput()
        today = cluster_today()
        self.fields["first"].initial = today.replace(day=1)
        self.fields["last"].initial = today

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        first, last = data.get("first"), data.get("last")
        if first and last and last < first:
            self.add_error("last", "the last day is before the first day")
        return data

    def teams(self):
        team = self.cleaned_data.get("team")
        return [team] if team else list(self.fields["team"].queryset)

    def clusters(self) -> list[Cluster] | None:
        """The one cluster asked for, or None: every cluster."""
        cluster = self.cleaned_data.get("cluster")
        return [cluster] if cluster else None

    def filters(self) -> dict[str, Any]:
        """The breakdown asked for: ``{"campaign": id | None, "model": str, "launcher": str}``."""
        return {"campaign": self.cleaned_data.get("campaign"), "model": self.cleaned_data.get("model") or "",
                "launcher": self.cleaned_data.get("launcher") or ""}

    @classmethod
    def from_query(cls, query, *, user: AbstractBaseUser) -> "BillForm":
        """Bound to the query string, with the defaults for what it leaves out; a ``preset``
        (this-week, last-week, this-month, last-month) sets the dates and daily periods."""
        today = cluster_today()
        data = {"period": "day", "first": today.replace(day=1).isoformat(), "last": today.isoformat(),
                "group_by": "team", "team": "", "cluster": "", "campaign": "", "model": "", "launcher": "",
                "preset": ""}
        data.update({k: v for k, v in query.items() if k in data})
        preset = next((p for p in periods.presets(today) if p["key"] == data["preset"]), None)
        if preset is not None:
            data.update(first=preset["first"].isoformat(), last=preset["last"].isoformat(), period=preset["period"])
        return cls(data, user=user)


class BudgetForm(forms.Form):
    team = ModelChoiceReadOnce(queryset=None, empty_label=None)
    period = forms.ChoiceField(choices=Budget.PERIODS, initial="month")
    amount_usd = forms.DecimalField(label="amount (USD)", max_digits=12, decimal_places=2, min_value=Decimal("0.01"))
    thresholds = forms.CharField(label="alert at (% of the amount)", initial="50, 80, 100",
                                 help_text="percentages separated by commas")
    on_exceed = forms.ChoiceField(choices=Budget.ON_EXCEED, label="a launch that would cross it",
                                  widget=forms.RadioSelect, initial="refuse")
    alert_emails = forms.CharField(label="alert e-mails", required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                   help_text="one address per line (the team's leads are always told)")

    def __init__(self, *args, user: AbstractBaseUser, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = bills.teams_billable_by(user).order_by("name")

    def clean_thresholds(self) -> list[float]:
        try:
            values = budgets.parse_thresholds(self.cleaned_data["thresholds"])
        except errors.BillError as exc:
            raise ValidationError(str(exc)) from None
        if not values:
            raise ValidationError("give at least one threshold, e.g. 80, 100")
        return values

    def clean_alert_emails(self) -> list[str]:
        addresses = []
        for line in self.cleaned_data["alert_emails"].splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                validate_email(line)
            except ValidationError:
                raise ValidationError(f"{line!r} is not an e-mail address") from None
            addresses.append(line)
        if len(addresses) > 20:
            raise ValidationError("at most 20 addresses")
        return addresses


class _LaunchBase(forms.Form):
    agent_definition = ModelChoiceReadOnce(queryset=AgentDefinition.objects.order_by("name", "-version"),
                                              label="agent definition", empty_label=None)
    team = ModelChoiceReadOnce(queryset=None, empty_label=None)
    cluster = ModelChoiceReadOnce(queryset=None, required=False, empty_label=None, to_field_name="name",
                                     help_text="the Grid Engine cell it runs on")
    queue = forms.ChoiceField(choices=())
    seats_per_task = forms.IntegerField(label="model API seats per task", min_value=0,
                                        max_value=limits.SEATS_PER_TASK_MAX, initial=1)
    model = forms.ChoiceField(required=False, choices=(), validators=[_model_validator],
                              help_text="a model of the price table; blank: the agent definition's default model")

    capability = "launch"

    def __init__(self, *args, user: AbstractBaseUser, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["team"].queryset = teams_with(user, self.capability).order_by("name")
        watched = clusters_watched()  # the default cluster first: the form's initial choice
        self.default_cluster = watched[0]
        self.fields["cluster"].queryset = Cluster.objects.filter(pk__in=[c.pk for c in watched]).order_by("name")
        self.fields["cluster"].initial = watched[0].name
        if len(watched) < 2:  # one cluster: nothing to choose
            self.fields["cluster"].widget = forms.HiddenInput()
        self.fields["queue"].choices = [(q, q) for q in settings.TCO_QUEUES]
        self.fields["model"].choices = model_choices()


def model_choices() -> list[tuple[str, str]]:
    """The model select: the agent definition's default first, then every model the price table
    prices (``billing.price_table``) and the agents' default models (marked when unpriced)."""
    table = costs.price_table()
    priced = set(table.models) if table is not None else set()
    defaults = set(AgentDefinition.objects.exclude(default_model="").values_list("default_model", flat=True))
    choices = [("", "the agent definition's default")]
    for name in sorted(priced | defaults):
        choices.append((name, name if name in priced else f"{name} (no price: cost unknown)"))
    return choices


class LaunchForm(_LaunchBase):
    """A campaign: agent, inputs (one per task), team, queue, seats, caps, predecessor, policy, priority."""

    INPUT_KINDS = [("params", "parameter list"), ("jsonl", "lines of a JSONL file"),
                   ("directory", "files in a directory")]

    # Needed to launch, not for a forecast (trial 4): checked in clean() when "launch" is pressed.
    name = forms.CharField(max_length=64, required=False, validators=[_name_validator], label="campaign name",
                           help_text="needed to launch; a forecast needs none")
    input_kind = forms.ChoiceField(choices=INPUT_KINDS, label="inputs", widget=forms.RadioSelect, initial="params")
    input_params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}), label="parameter list",
                                   help_text="one task per line: key=value pairs separated by spaces; "
                                             "or one line key=1..N for N tasks")
    input_jsonl = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}), label="JSONL",
                                  help_text="one JSON object per line (or upload a file below)")
    input_jsonl_file = forms.FileField(required=False, label="JSONL file")
    input_directory = forms.CharField(required=False, max_length=255, label="input directory",
                                      help_text="a directory under your team's folder of the inputs root; "
                                                "one task per file")
    concurrency_cap = forms.IntegerField(required=False, min_value=1, max_value=limits.MAX_TASKS_PER_CAMPAIGN,
                                         label="concurrency cap (-tc)")
    predecessor_job = forms.IntegerField(required=False, min_value=1, max_value=MAX_JOB_NUMBER,
                                         label="predecessor array job (-hold_jid_ad)")
    policy = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}), label="sandbox policy (YAML)",
                             help_text="blank: the agent definition's default policy")
    token_cap = forms.IntegerField(required=False, min_value=1, max_value=10**12, label="token cap per task")
    cost_cap_usd = forms.DecimalField(required=False, min_value=Decimal("0.000001"), max_digits=12, decimal_places=6,
                                      label="cost cap per task (USD)")
    priority = forms.IntegerField(initial=0, min_value=limits.PRIORITY_MIN, max_value=limits.PRIORITY_MAX,
                                  help_text="-1023 to 0 (urgent launchers up to 1024)")
    rerunnable = forms.BooleanField(required=False, label="rerun a task elsewhere if its host is lost (-r y)")
    advance_reservation = forms.TypedChoiceField(required=False, coerce=int, empty_value=None,
                                                 label="advance reservation (-ar)",
                                                 help_text="run in capacity your team booked (Reservations page)")
    # Bounded in __init__ by the site's maxima (limits.sandbox_maxima); MiB on the form, bytes beyond it.
    memory_mib = forms.IntegerField(required=False, label="memory limit per task (MiB)")
    work_mib = forms.IntegerField(required=False, label="disk limit per task (MiB)")

    #: Form field -> (the runner spec's limit, what the help text says it bounds).
    SANDBOX_FIELDS = {"memory_mib": ("memory_bytes", "the memory of the agent's processes together"),
                      "work_mib": ("work_bytes", "what the agent keeps in its work directory")}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The site's maxima bound the field itself; the ceiling of the chosen queue and agent (an
        # admin's, limits.sandbox_ceiling) is shown in the help and checked in clean().
        maxima = limits.sandbox_maxima()
        queue, agent = self._chosen_queue_and_agent()
        ceiling = limits.sandbox_ceiling(queue, agent)
        for name, (key, what) in self.SANDBOX_FIELDS.items():
            field = self.fields[name]
            low, high = -(-limits.LAUNCH_SANDBOX_MINIMA[key] // (1 << 20)), maxima[key] // (1 << 20)
            field.min_value, field.max_value = low, high
            field.validators += [MinValueValidator(low), MaxValueValidator(high)]
            field.widget.attrs.update({"min": low, "max": high})
            top, default = ceiling[key]["max"] >> 20, ceiling[key]["default"] >> 20
            if top == high and default == high and not self._admin_ceilings(key):
                field.help_text = f"{what}: {low} to {high} MiB; blank: the site's limit, {high} MiB"
            else:
                field.help_text = (f"{what}: {low} to {top} MiB for {agent} on {queue} ({ceiling[key]['by']}); "
                                   f"blank: {default} MiB")
                others = self._admin_ceilings(key)
                if others:
                    field.help_text += f". Ceilings set by admins: {others}"
        from dashboards.launch.reservations import team_choices
        self.fields["advance_reservation"].choices = [("", "none")] + team_choices(self.user, self.default_cluster)
        folders = ", ".join(str(inputs.team_inputs_folder(t)) for t in self.fields["team"].queryset)
        if folders:
            self.fields["input_directory"].help_text += f" ({folders})"
        # An uploaded file is read into the text box, so a form shown again keeps it.
        if self.is_bound and self.files.get("input_jsonl_file") is not None:
            upload = self.files["input_jsonl_file"]
            data = self.data.copy()
            if upload.size > limits.INPUT_MAX_BYTES:
                self._upload_error = f"the file is larger than {limits.INPUT_MAX_BYTES // (1024 * 1024)} MB"
            else:
                try:
                    data["input_jsonl"] = upload.read().decode("utf-8")
                    data["input_kind"] = "jsonl"
                    self._upload_error = ""
                except UnicodeDecodeError:
                    self._upload_error = "the file is not UTF-8 text"
            self.data = data
        else:
            self._upload_error = ""

    def _chosen_queue_and_agent(self) -> tuple[str, str]:
        """The queue and the agent definition's name the form is for: the posted ones when they are
        choices of the form, else the form's first (initial) ones; "" when there is none."""
        queues = [q for q, _ in self.fields["queue"].choices]
        agents = {str(a.pk): a.name for a in self.fields["agent_definition"].queryset}
        queue = self.data.get("queue") if self.is_bound else None
        agent = self.data.get("agent_definition") if self.is_bound else None
        return (queue if queue in queues else (queues[0] if queues else ""),
                agents.get(str(agent)) or next(iter(agents.values()), ""))

    @staticmethod
    def _admin_ceilings(key: str) -> str:
        """The admins' ceilings of limit ``key`` per queue and agent, in words
        ("queue classic.q 1024 MiB, agent solver 512 MiB"); "" when none is set."""
        parts = []
        for kind, table in (("queue", settings.TCO_QUEUE_SANDBOX_LIMITS), ("agent", settings.TCO_AGENT_SANDBOX_LIMITS)):
            for who, entry in sorted((table or {}).items()):
                bounds = entry.get(key) or {}
                if "max" in bounds:
                    parts.append(f"{kind} {who} {bounds['max'] >> 20} MiB")
        return ", ".join(parts)

    def input_examples(self) -> dict[str, str]:
        """Agent definition id -> an example parameter list (``inputs.input_example``), for the form."""
        return {str(a.pk): inputs.input_example(a.name)
                for a in self.fields["agent_definition"].queryset if inputs.input_example(a.name)}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self._upload_error:
            self.add_error("input_jsonl_file", self._upload_error)
            return data
        if "launch" in self.data and not data.get("name") and "name" not in self.errors:
            self.add_error("name", "a campaign name is needed to launch (a forecast needs none)")
        kind = data.get("input_kind")
        try:
            items = None
            if kind == "params":
                items = inputs.inputs_from_params(data.get("input_params") or "")
            elif kind == "jsonl":
                items = inputs.inputs_from_jsonl(data.get("input_jsonl") or "")
            elif kind == "directory":
                if data.get("team") is None:
                    raise LaunchError("input directory: choose the team first (its folder of the inputs root "
                                      "holds the directory)")
                items = inputs.inputs_from_directory(data.get("input_directory") or "", team=data["team"])
            if items is not None and data.get("agent_definition") is not None:
                inputs.check_inputs(data["agent_definition"].name, items)
            # Only inputs that passed: refused ones never count as tasks (the cap check below).
            data["inputs"] = items
        except LaunchError as exc:
            self.add_error({"params": "input_params", "jsonl": "input_jsonl",
                            "directory": "input_directory"}[kind], str(exc))
        items = data.get("inputs")
        cap = data.get("concurrency_cap")
        if items is not None and cap is not None and cap > len(items):
            self.add_error("concurrency_cap", f"at most the number of tasks ({len(items)})")
        team, priority = data.get("team"), data.get("priority")
        if team is not None and priority is not None:
            limit = limits.priority_limit(self.user, team)
            if priority > limit:
                self.add_error("priority", f"at most {limit} for your role on {team.name}"
                               + (" (only urgent launchers may raise priority)" if limit == 0 else ""))
        if data.get("predecessor_job") is not None:
            # Forecast and Launch alike (fresh attack, round 3: the forecast took another team's job
            # and said only that it counted no wait; Launch refused it): the launch's own rule.
            try:
                check_visible(self.user, data["predecessor_job"], data.get("cluster") or cluster_get_default())
            except LaunchError as exc:
                self.add_error("predecessor_job", str(exc))
        if data.get("policy"):
            try:
                launch_policy.validate_policy(data["policy"])
            except LaunchError as exc:
                self.add_error("policy", str(exc))
        if data.get("queue") and data.get("agent_definition") is not None:
            ceiling = limits.sandbox_ceiling(data["queue"], data["agent_definition"].name)
            for name, (key, _) in self.SANDBOX_FIELDS.items():
                value, top = data.get(name), ceiling[key]["max"] >> 20
                if value is not None and name not in self.errors and value > top:
                    self.add_error(name, f"at most {top} MiB for {data['agent_definition'].name} on "
                                         f"{data['queue']} ({ceiling[key]['by']})")
        return data

    def launch_request(self) -> service.LaunchRequest:
        """The valid form as the launch service's request (fields mapped, nothing decided here)."""
        data = self.cleaned_data
        return service.LaunchRequest(
            team=data["team"], agent_definition=data["agent_definition"], inputs=data["inputs"], name=data["name"],
            queue=data["queue"], seats_per_task=data["seats_per_task"], concurrency_cap=data["concurrency_cap"],
            priority=data["priority"], model=data["model"], policy=data["policy"],
            predecessor_job=data["predecessor_job"], token_cap=data["token_cap"], cost_cap_usd=data["cost_cap_usd"],
            rerunnable=data.get("rerunnable", False), advance_reservation=data.get("advance_reservation"),
            cluster=data.get("cluster"),
            **{key: data[name] << 20 for name, (key, _) in self.SANDBOX_FIELDS.items() if data.get(name) is not None})


class UrgentForm(_LaunchBase):
    """One urgent agent (urgent launchers only)."""

    capability = "urgent"
    name = forms.CharField(max_length=64, required=False, validators=[_name_validator],
                           help_text="blank: urgent-<agent name>")
    input = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), initial='{"task": 1}',
                            label="input (JSON object)")

    def clean_input(self) -> dict[str, Any]:
        """The typed input as a JSON object; a ValidationError (a form error) for text that is not
        JSON, that nests deeper than ``limits.INPUT_MAX_DEPTH``, or that is not an object."""
        text = self.cleaned_data["input"]
        try:
            # Bounded: 100,000 "[" is a form error, not a RecursionError's 500 and traceback in the log.
            value = inputs.json_loads_bounded(text, what="the input")
        except LaunchError as exc:
            raise ValidationError(str(exc)) from None
        if not isinstance(value, dict):
            raise ValidationError('a JSON object, e.g. {"task": 1}')
        return value


class CampaignControlForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in (*actions.CAMPAIGN_ACTIONS, "retry", "retry_infrastructure")])
    confirm = forms.BooleanField(required=False)


class TriageActionForm(forms.Form):
    ACTIONS = [("hold", "hold"), ("release", "release"), ("delete", "delete"), ("priority", "change priority"),
               ("clear_error", "clear error")]

    action = forms.ChoiceField(choices=ACTIONS)
    job_number = forms.IntegerField(min_value=1, max_value=MAX_JOB_NUMBER, widget=forms.HiddenInput)
    tasks = forms.CharField(required=False, max_length=1000, help_text="blank: every task; or 1-5,7")
    priority = forms.IntegerField(required=False, min_value=limits.PRIORITY_MIN, max_value=limits.PRIORITY_MAX,
                                  help_text="-1023 to 1024 (change priority only)")
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def clean_tasks(self):
        try:
            return ranges.parse_task_ranges(self.cleaned_data["tasks"])
        except LaunchError as exc:
            raise ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("action") == "priority":
            if data.get("priority") is None:
                self.add_error("priority", "give the new priority (-1023 to 1024)")
            if data.get("tasks"):
                self.add_error("tasks", "priority applies to the whole job; leave tasks empty")
        return data


class AgentDefinitionForm(forms.ModelForm):
    """The registry: name, version, command (argv list as JSON), defaults, input kind, timeout."""

    command = forms.JSONField(help_text='argv as a JSON list, e.g. ["/usr/bin/python3", "-m", "agent", "{input}", '
                                        '"{workdir}"]', widget=forms.Textarea(attrs={"rows": 2}))

    class Meta:
        model = AgentDefinition
        fields = ["name", "version", "description", "command", "default_model", "default_policy", "input_kind",
                  "timeout_s"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2}),
                   "default_policy": forms.Textarea(attrs={"rows": 4})}

    def clean_command(self) -> list[str]:
        value = self.cleaned_data["command"]
        if not isinstance(value, list) or not value or len(value) > 64:
            raise ValidationError("a JSON list of 1 to 64 strings")
        for item in value:
            if not isinstance(item, str) or not item or len(item) > 1024 or any(c in item for c in "\0\n\r"):
                raise ValidationError("every element must be a non-empty string without NUL or newlines")
        if not value[0].startswith("/"):
            raise ValidationError("the first element is the program: an absolute path")
        return value

    def clean_default_model(self) -> str:
        value = self.cleaned_data["default_model"].strip()
        _model_validator(value)
        return value

    def clean_default_policy(self) -> str:
        try:
            return launch_policy.validate_policy(self.cleaned_data["default_policy"])
        except LaunchError as exc:
            raise ValidationError(str(exc)) from None

    def clean_timeout_s(self) -> int:
        value = self.cleaned_data["timeout_s"]
        if not 1 <= value <= 7 * 86400:
            raise ValidationError("1 second to 7 days")
        return value
