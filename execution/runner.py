"""The runner: what Grid Engine starts for each agent task (``python -m execution.runner``).

No Django, and quick to start: it runs once per task. It reads the task's
runner spec, builds the agent's sandbox, runs the agent in it, tears it down
and exits with the agent's status, leaving one runner record in the spool.

Environment (set at launch; ``JOB_ID``/``SGE_TASK_ID`` come from Grid Engine):
``TCO_SPOOL_DIR``, ``TCO_CAMPAIGN_ID``, ``JOB_ID``, ``SGE_TASK_ID`` (the
string ``undefined`` for a non-array job; the runner then uses task 1 and
flags ``task_number_defaulted``). Optional: ``TCO_CREDENTIALS_FILE`` (JSON
``{"name": "secret"}``, readable by the submit account only; default
``<spool>/credentials.json``; read by the proxy, outside the sandbox, at the
first request that needs it), ``TCO_PRICES_FILE`` (the price table for the
proxy, execution/metering/prices.py's file format; default
``<spool>/prices.json`` if it exists), ``TCO_SANDBOX_MASK`` (tco's state
directory, or more host paths, ``:``-separated: hidden from the agent, a
listed path inside one refused), ``TCO_SANDBOX_SHARED`` (``:``-separated
directories inside a ``TCO_SANDBOX_MASK`` path that a policy may list anyway,
e.g. a demo's output directory; never inside the spool), ``TCO_SANDBOX_RUNTIME``
(``bubblewrap`` or ``openshell``; overrides the spec), ``TMPDIR`` (where the
runner's private directory goes; Grid Engine sets one per task).

Limits (issue 11, finding 5), each a positive integer with a safe default
(:data:`LIMIT_DEFAULTS`, :data:`PROXY_LIMITS`): ``TCO_SANDBOX_TMPFS_BYTES`` (size of the
sandbox's own /tmp, /var/tmp, /dev/shm, /run; 256 MiB each),
``TCO_SANDBOX_MAX_PROCESSES`` (RLIMIT_NPROC inside the sandbox, threads
included; 256), ``TCO_SANDBOX_WORK_BYTES`` (the work directory's size, checked
every ``TCO_SANDBOX_WORK_CHECK_S`` seconds (default 10) by walking it; over it,
the agent is stopped, the record flagged ``workdir_over_quota`` and the
runner exits :data:`EXIT_WORKDIR_QUOTA`; 4 GiB), and the metering proxy's
(execution/metering/proxy.py ``Limits``): ``TCO_PROXY_MAX_CONNECTIONS`` (32),
``TCO_PROXY_MAX_HEADER_BYTES`` (8190), ``TCO_PROXY_MAX_BODY_BYTES`` (32 MiB),
``TCO_PROXY_MAX_BUFFERED_BYTES`` (64 MiB of request bodies held at once),
``TCO_PROXY_RECORDS_IN_MEMORY`` (1000) and ``TCO_PROXY_RECORD_FILE_BYTES``
(64 MiB of ``requests.jsonl``; later records are dropped and counted in the
usage's ``records_dropped``).

The spool layout, the runner spec and the runner record are the spool contract
(execution/spool.py: ``SpoolLayout``, ``RunnerSpec``, ``RunnerRecord``); they
are summarised here. The runner spec, ``<spool>/campaigns/<campaign_id>/spec.json``::

    {"version": 1, "campaign_id": str|int,
     "agent": {"command": [argv...], "environment": {str: str},   # optional
               "outputs": ["verdict.json", "*.txt"]},                # optional
     "inputs_file": path, "timeout_s": number|null, "kill_grace_s": number,   # optional
     "model": str, "token_cap": int, "cost_cap_usd": "decimal",         # optional
     "policy": YAML text | "/abs/path.yaml" | {mapping},                # optional
     "model_endpoints": [{"name", "provider", "scheme", "host", "port",   # optional
                          "path_prefixes": ["/v1"], "credential_name"}],
     "model_endpoint": {"base_url": "http://127.0.0.1:8123",            # optional
                        "credential_name": "demo-anthropic"},
     "model_endpoints": [{"name", "provider", "scheme", "host", "port",  # optional
                          "path_prefixes", "credential_name"}],
     "sandbox": {"runtime": "auto"|"bubblewrap"|"openshell"},          # optional
     "network_ceilings": [{"label": str, "network_policies": {...}}]}  # optional

``{input}`` and ``{workdir}`` in the command become the task's input file and
work directory as the agent sees them (``/sandbox/input.json``,
``/sandbox``). ``inputs_file`` is JSONL; line N (1-based) is task N's input.
Without ``policy`` the runner applies :func:`default_policy` (system
directories and tco's own code read-only, the work directory and a private
``/tmp`` writable, no network). Before anything starts, the runner refuses a
policy for every reason :func:`execution.sandbox.checks.refusals` gives (the
function the launch form calls too). Credentials: only the model endpoints
tco's launch side registered (``model_endpoints``, written from the site's
admin-registered endpoints) ever receive one, and only the credential their
entry names (``credential_name`` in the credentials file), when a request's
destination (scheme, host, port, path prefix) is theirs and its policy
endpoint has a ``credential_binding``; a policy's ``credential_binding`` never
chooses a credential. ``model_endpoint`` (the older form, written by tco's
demo) is one registered endpoint: ``base_url`` must be a ``protocol: rest``
endpoint of the policy, requests to it go to ``base_url`` with
``credential_name``. (The older ``credentials`` map of providers to names is
ignored, with a note.) ``token_cap``/``cost_cap_usd`` are the proxy's per-task caps
(a cost cap needs a price table); ``model`` reaches the agent as
``TCO_MODEL``. ``outputs``
are files in the work directory (relative paths or globs) copied, capped, to
``records/<campaign_id>/<task>.outputs/`` for the pages.

The sandbox (execution/sandbox/): bubblewrap by default; OpenShell's CLI where
``openshell`` is on PATH and the policy has no loopback endpoint (OpenShell
refuses those). The agent's environment is cleared and rebuilt: ``PATH``,
``HOME=/sandbox``, ``ANTHROPIC_BASE_URL=http://127.0.0.1:8790`` and
``OPENAI_BASE_URL=http://127.0.0.1:8790/v1`` (the relay on the sandbox's own
loopback), placeholder API keys (the proxy drops them and adds the real
credential), ``TCO_CAMPAIGN_ID``, ``TCO_TASK_NUMBER``, ``TCO_INPUT_FILE``, ``TCO_WORK_DIR``,
``PYTHONPATH``/``PYTHONDONTWRITEBYTECODE``/``LANG``/``LC_ALL``/``TZ`` from
the runner's environment, and ``agent.environment``. Never a credential.

The metering proxy (execution/metering/proxy.py) listens on the Unix socket
bound into the sandbox. It is started when the agent first connects to its
base URL (the relay says so), so an agent that never calls a model pays
nothing for it; each request is appended to
``records/<campaign_id>/<task>.requests.jsonl`` as it is metered.

Live network policy (issue 17, item 4; bubblewrap runtime): the web side may
narrow or widen a running campaign's ``network_policies`` by writing
``campaigns/<campaign_id>/network.json`` (execution/spool.py
``NetworkPolicyFile``, a rising ``policy_version``). The runner applies the
file present at its start before the agent starts, then looks at it every
:data:`NETWORK_POLICY_POLL_S` seconds; a higher version is re-checked here
(execution/sandbox/live_network.py: the runner's validator, the bubblewrap
refusals, and the spec's ``network_ceilings``, or without them the launch
policy's own network part) and, when it passes, the metering proxy routes
every new request by it (requests in flight are not cut; only registered model
endpoints ever get a credential, as before). A file that is malformed or wider
than allowed is refused: the previous rules stay. The record's
``sandbox.network_policy`` is ``{"version": int in force at the end,
"changes": [{"version", "at", "applied": bool, "error": str|null}]}``
(at most :data:`MAX_NETWORK_CHANGES_NOTED` changes; the rest are counted in
``changes_not_noted``). Under OpenShell the runner does not apply changes.

Files under the spool directory:

- creates ``work/<campaign_id>/<task_number>/`` (shown at ``/sandbox``; its
  input is copied to ``input.json`` there);
- writes ``records/<campaign_id>/<task_number>.stdout`` / ``.stderr`` (the
  agent's output, each capped at :data:`OUTPUT_CAP_BYTES`), the
  ``.requests.jsonl`` and ``.outputs/`` above, and last
  ``records/<campaign_id>/<task_number>.json`` atomically (temp file, fsync,
  ``os.replace``): the runner record, version 2::

    {"version": 2, "campaign_id": str, "task_number": int, "job_number": int|null,
     "hostname": str,
     "stages": {"task_started_at", "sandbox_create_at", "sandbox_ready_at",
                "agent_started_at", "agent_exited_at", "teardown_done_at"},
     "exit_status": int|null, "signal": int|null,
     "stdout_path": str|null, "stderr_path": str|null,
     "stdout_truncated": bool, "stderr_truncated": bool,
     "outputs": [{"name", "path", "bytes", "truncated"}],
     "sandbox": {"runtime", "policy_sha256", "uid", "gid", "notes": [str], "log": str} | null,
     "usage": {proxy totals} | null, "requests_path": str | null,
     "flags": [str], "runner_signal": int|null, "error": str|null}

  (``stdout_path``/``stderr_path`` are null when the agent never started.
  Version 1 had neither ``outputs``, ``sandbox``, ``usage`` nor
  ``requests_path``.)

Stages are UTC ISO-8601 strings with microseconds and a ``Z`` (or null when
not reached), from a monotonic clock anchored to UTC when the module is
loaded, so they are ordered even if the wall clock steps.
``sandbox_create_at`` is taken just before bubblewrap starts;
``sandbox_ready_at`` when the relay inside reports the sandbox built and its
listener up, before the agent is executed; ``agent_started_at`` when the
agent's exec is done; ``agent_exited_at`` when it exited by itself (the
relay's times, same monotonic clock). When the runner stops the agent
(a signal to the runner, a timeout) ``agent_exited_at`` stays null and
``teardown_done_at`` says when it was gone.

``exit_status``/``signal`` describe the agent process (``signal`` when it
died of one, including the runner's SIGTERM, or SIGKILL when its sandbox was
killed). ``runner_signal`` is the signal that interrupted the runner. Flags:
``runner_error`` (see ``error``), ``runner_signalled``, ``agent_timeout``,
``output_incomplete`` (an output pipe stayed open), ``task_number_defaulted``,
``proxy_error`` (the proxy could not start or stop cleanly; see ``error``),
``outputs_skipped`` (a declared output was not a regular file in the work
directory, or there were too many), ``unmetered_runtime`` (OpenShell carried
the agent's traffic, so tco did not meter it), ``workdir_over_quota`` (the
work directory passed ``TCO_SANDBOX_WORK_BYTES``).

The runner's exit status is the agent's; 128+N when the agent died of
signal N or the runner was interrupted by signal N; :data:`EXIT_TIMEOUT` on
timeout; :data:`EXIT_CONFIG` when it could not start the agent (bad
environment, spec, input or policy, or the sandbox did not start);
:data:`EXIT_INTERNAL` on a runner bug. (99 and 100 mean "reschedule" and
"error state" to Grid Engine and are never used.)

Processes and signals: the runner makes itself a process-group leader if
Grid Engine has not. The sandbox runs in its own session (bubblewrap
``--new-session``), outside the job's process group; the relay, its PID 1,
stops and continues the sandbox when Grid Engine suspends and resumes the
runner. On SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU (each of which
would otherwise kill the runner without a record; Grid Engine sends
SIGUSR1/SIGXCPU for soft limits and SIGUSR2 before qdel with ``-notify``)
the runner asks the relay to SIGTERM every process of the sandbox, waits
``kill_grace_s`` (:data:`KILL_GRACE_S`; at most :data:`SIGNALLED_GRACE_S`
after a signal, so that the record is written within Grid Engine's notify
time), kills the sandbox, and writes the record. SIGKILL
cannot be caught: a task killed outright (qdel with the default
``terminate_method``) leaves no record, but its sandbox dies with it
(``--die-with-parent`` ends the sandbox's PID namespace).
"""
from __future__ import annotations

import time

# Anchor the stage clock before anything else is imported: task_started_at is
# the runner's first timestamp, and queue wait is measured up to it.
_ANCHOR_WALL_NS = time.time_ns()
_ANCHOR_MONO_NS = time.monotonic_ns()

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from execution.spool import (RECORD_VERSION, SPEC_VERSION, STAGES, RunnerRecord, RunnerSpec,  # noqa: E402,F401
                             SpecError, SpoolError, SpoolLayout, check_campaign_id)

OUTPUT_CAP_BYTES = 1 << 20
OUTPUT_FILE_CAP_BYTES = 1 << 20
MAX_OUTPUT_FILES = 64
KILL_GRACE_S = 5.0
SIGNALLED_GRACE_S = 3.0  # Grid Engine's notify time before its SIGKILL is 5 s on the dev cluster
OUTPUT_DRAIN_S = 2.0
PROXY_STOP_S = 15.0
#: How often the runner looks at the campaign's network policy file (seconds).
NETWORK_POLICY_POLL_S = 0.25
#: The most network policy changes one runner record notes.
MAX_NETWORK_CHANGES_NOTED = 100
EXIT_TIMEOUT = 124
EXIT_WORKDIR_QUOTA = 122
#: The sandbox's limits (environment variable -> default); see the module doc.
LIMIT_DEFAULTS = {"TCO_SANDBOX_TMPFS_BYTES": 256 << 20, "TCO_SANDBOX_MAX_PROCESSES": 256,
                  "TCO_SANDBOX_WORK_BYTES": 4 << 30, "TCO_SANDBOX_WORK_CHECK_S": 10}
#: The metering proxy's limits: environment variable -> field of execution/metering/proxy.py's
#: ``Limits`` (whose defaults apply when the variable is unset).
PROXY_LIMITS = {"TCO_PROXY_MAX_CONNECTIONS": "max_connections", "TCO_PROXY_MAX_HEADER_BYTES": "max_header_bytes",
                "TCO_PROXY_MAX_BODY_BYTES": "max_body_bytes", "TCO_PROXY_MAX_BUFFERED_BYTES": "max_buffered_bytes",
                "TCO_PROXY_RECORDS_IN_MEMORY": "records_in_memory",
                "TCO_PROXY_RECORD_FILE_BYTES": "record_file_bytes"}
EXIT_CONFIG = 78
EXIT_INTERNAL = 70
INSIDE_WORKDIR = "/sandbox"
PLACEHOLDER_KEY = "tco-sandbox-no-key-the-proxy-adds-it"
PASSED_THROUGH_ENV = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "LANG", "LC_ALL", "TZ")
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                       signal.SIGUSR2, signal.SIGXCPU)


class RunnerError(Exception):
    """The runner could not start the agent (environment, spec, input or policy is wrong)."""


class _Interrupted(BaseException):
    """Raised from a signal handler to leave a blocking wait. BaseException so
    that no ``except Exception`` on the way swallows it."""


class StageClock:
    """UTC timestamps from the monotonic clock, anchored once to the wall clock."""

    def __init__(self, wall_ns: int = _ANCHOR_WALL_NS, mono_ns: int = _ANCHOR_MONO_NS) -> None:
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns

    def now_ns(self) -> int:
        """Nanoseconds since the epoch, UTC."""
        return self.wall_of(time.monotonic_ns())

    def wall_of(self, mono_ns: int) -> int:
        """The UTC time (ns since the epoch) of a CLOCK_MONOTONIC reading."""
        return self._wall_ns + (mono_ns - self._mono_ns)

    def anchor_iso(self) -> str:
        """The anchor itself as ISO text (``task_started_at``)."""
        return self.iso(self._wall_ns)

    def iso(self, ns: int | None = None) -> str:
        """``2025-01-02T03:04:05.123456Z`` for ``ns`` (default now)."""
        ns = self.now_ns() if ns is None else ns
        seconds, rest = divmod(ns, 1_000_000_000)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"

    def iso_mono(self, mono_ns: int | None) -> str | None:
        """:meth:`iso` of a monotonic reading (None stays None)."""
        return None if mono_ns is None else self.iso(self.wall_of(mono_ns))


class _Capture(threading.Thread):
    """Copy one pipe into a file, keeping at most ``cap`` bytes and draining the rest."""

    def __init__(self, fd: int, path: str, cap: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.path = path
        self.cap = cap
        self.written = 0
        self.truncated = False

    def run(self) -> None:
        with os.fdopen(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
                       "wb") as out:
            while True:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                room = self.cap - self.written
                if room > 0:
                    out.write(chunk[:room])
                    self.written += min(room, len(chunk))
                if len(chunk) > room:
                    self.truncated = True
        os.close(self.fd)


def _tree_bytes(root: str) -> int:
    """Disk space (bytes, from ``st_blocks``) the tree at ``root`` takes, links not followed;
    what vanishes during the walk is skipped."""
    total, stack = 0, [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total


class _WorkdirWatch(threading.Thread):
    """Walk the work directory every ``interval_s`` seconds; once it takes more than
    ``limit`` bytes, call ``on_over`` once and stop."""

    def __init__(self, path: str, limit: int, interval_s: float, on_over) -> None:
        super().__init__(daemon=True, name="tco-workdir-watch")
        self.path, self.limit, self.interval_s, self.on_over = path, limit, interval_s, on_over
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            if _tree_bytes(self.path) > self.limit:
                self.on_over()
                return


class _NetworkPolicyWatch(threading.Thread):
    """Call ``on_change`` whenever the file at ``path`` changes (size, mtime or inode, looked at
    every ``interval_s`` seconds), until ``done`` is set."""

    def __init__(self, path: str, interval_s: float, on_change) -> None:
        super().__init__(daemon=True, name="tco-network-policy-watch")
        self.path, self.interval_s, self.on_change = path, interval_s, on_change
        self.done = threading.Event()
        self.seen = self.signature()

    def signature(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            now = self.signature()
            if now is not None and now != self.seen:
                self.seen = now
                self.on_change()


def _group_members() -> list[int]:
    """Live processes in the runner's process group, other than the runner (Linux /proc)."""
    me, group = os.getpid(), os.getpgrp()
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after "(comm)": state ppid pgrp ...; comm may hold spaces or ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == group and fields[0] != b"Z":
            members.append(int(name))
    return members


def default_policy() -> dict:
    """The policy of a spec without one: system directories and tco's own code (for its
    bundled agents) read-only, the work directory and a private /tmp writable, no network."""
    read_only = ["/usr", "/lib", "/lib64", "/bin", "/etc", os.path.join(CODE_ROOT, "demo")]
    if sys.prefix != sys.base_prefix:  # the venv the bundled agents run with
        read_only.append(sys.prefix)
    return {"version": 1,
            "filesystem_policy": {"include_workdir": True, "read_only": read_only,
                                  "read_write": [INSIDE_WORKDIR, "/tmp"]},
            "process": {"run_as_user": "sandbox", "run_as_group": "sandbox"}}


def _remove_tree(path: str) -> None:
    """Remove the runner's private directory (its own small tree; links are not followed)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(entry.path)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def _open_beneath(root: str, relative: str) -> int:
    """Open ``root/relative`` for reading without following any link on the way (the agent
    wrote the work directory). Raises OSError."""
    parts = [p for p in relative.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise OSError(f"{relative!r} is not a relative path")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def _registered_hosts(spec: dict) -> list[dict]:
    """``{"host", "port"}`` of each registered model endpoint of the spec (``model_endpoints``
    and the older ``model_endpoint.base_url`` with a credential), as far as they are well formed
    (the proxy setup reports the malformed ones)."""
    from urllib.parse import urlsplit

    found = [e for e in spec.get("model_endpoints") or [] if isinstance(e, dict)]
    endpoint = spec.get("model_endpoint") or {}
    if isinstance(endpoint.get("base_url"), str) and endpoint.get("credential_name"):
        try:
            parts = urlsplit(endpoint["base_url"])
            found.append({"host": parts.hostname or "", "port": parts.port or (443 if parts.scheme == "https" else 80)})
        except ValueError:
            pass
    return found


def _unregistered_notes(policy, registered: list, upstreams: dict[str, str]) -> list[str]:
    """A note for each policy endpoint that binds a credential but is no registered model
    endpoint: its requests carry none."""
    notes = []
    for rule, e in policy.endpoints():
        if not (rule.binaries and e.credential_provider and e.protocol == "rest" and e.host and not e.wildcard):
            continue
        for port in e.ports:
            upstream = upstreams.get(f"{e.host}:{port}") or f"{'http' if e.loopback else 'https'}://{e.host}:{port}"
            from urllib.parse import urlsplit

            parts = urlsplit(upstream)
            if not any(r.scheme == parts.scheme and r.host.lower() == (parts.hostname or "").lower()
                       and r.port == (parts.port or (443 if parts.scheme == "https" else 80)) for r in registered):
                notes.append(f"{e.where}: {e.host}:{port} is not a registered model endpoint: requests there "
                             "carry no credential (credential_binding never chooses one)")
    return notes


class Runner:
    """One task's run. ``environ`` is the process environment (a mapping)."""

    def __init__(self, environ, *, clock: StageClock | None = None,
                 kill_grace_s: float = KILL_GRACE_S, output_cap: int = OUTPUT_CAP_BYTES) -> None:
        self.environ = dict(environ)
        self.clock = clock or StageClock()
        self.kill_grace_s = kill_grace_s
        self.output_cap = output_cap
        self.stages: dict[str, str | None] = dict.fromkeys(STAGES)
        self.stages["task_started_at"] = self.clock.anchor_iso()
        self.flags: list[str] = []
        self.error: str | None = None
        self.exit_status: int | None = None
        self.agent_signal: int | None = None
        self.runner_signal: int | None = None
        self.timed_out = False
        self.exit_code = EXIT_INTERNAL
        self.spool = self.campaign_id = None
        self.task_number: int | None = None
        self.job_number: int | None = None
        self.record_dir = self.work_dir = None
        self.layout: SpoolLayout | None = None
        self.private_dir: str | None = None
        self.sandbox = None
        self.sandbox_info: dict | None = None
        self.captures: list[_Capture] = []
        self.outputs: list[dict] = []
        self.usage: dict | None = None
        self.requests_path: str | None = None
        self._proxy_thread: threading.Thread | None = None
        self._proxy_handle = None
        self._proxy_error: str | None = None
        self._proxy_config: dict | None = None
        self._netpol_lock = threading.Lock()  # the rules in force vs. the proxy starting
        self._netpol_base = None  # the launch policy (execution.sandbox.policy.Policy)
        self._netpol_ceilings: list = []
        self._netpol_seen = 0  # the highest policy_version looked at
        self._netpol_watch: _NetworkPolicyWatch | None = None
        self._armed = False
        self.workdir_over = False
        self._workdir_watch: _WorkdirWatch | None = None

    # ---- signals
    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGALRM:
            if not self.workdir_over:  # the work directory watch sends SIGALRM too
                self.timed_out = True
        elif self.runner_signal is None:
            self.runner_signal = signum
        if self._armed:
            self._armed = False
            raise _Interrupted()

    def _install_signal_handlers(self) -> None:
        for sig in TERMINATING_SIGNALS + (signal.SIGALRM,):
            signal.signal(sig, self._on_signal)

    def _arm(self) -> None:
        self._armed = True
        if self.runner_signal is not None or self.timed_out or self.workdir_over:  # arrived while disarmed
            self._armed = False
            raise _Interrupted()

    # ---- setup
    def _read_environment(self) -> None:
        env = self.environ
        self.spool = env.get("TCO_SPOOL_DIR") or None
        self.campaign_id = env.get("TCO_CAMPAIGN_ID") or None
        if not self.spool or not os.path.isabs(self.spool):
            raise RunnerError("TCO_SPOOL_DIR must be set to an absolute path")
        try:
            check_campaign_id(self.campaign_id or "")
        except SpoolError:
            raise RunnerError(f"TCO_CAMPAIGN_ID {self.campaign_id!r} is missing or not a safe name") from None
        self.layout = SpoolLayout(self.spool)
        job_id = env.get("JOB_ID", "")
        self.job_number = int(job_id) if job_id.isdigit() else None
        task_id = env.get("SGE_TASK_ID", "undefined")
        if task_id.isdigit() and int(task_id) >= 1:
            self.task_number = int(task_id)
        elif task_id in ("", "undefined"):
            self.task_number = 1
            self.flags.append("task_number_defaulted")
        else:
            raise RunnerError(f"SGE_TASK_ID {task_id!r} is not a task number")
        self.record_dir = self.layout.records_dir(self.campaign_id)
        os.makedirs(self.record_dir, mode=0o700, exist_ok=True)
        for name in (*LIMIT_DEFAULTS, *PROXY_LIMITS):  # a bad limit is a configuration error at once
            if name != "TCO_SANDBOX_WORK_CHECK_S":
                self._limit(name)
        self._check_interval()

    def _limit(self, name: str) -> int | None:
        """A limit from the environment: a positive integer, else its default
        (:data:`LIMIT_DEFAULTS`; None for :data:`PROXY_LIMITS`: the proxy's own)."""
        text = self.environ.get(name)
        if text in (None, ""):
            return LIMIT_DEFAULTS.get(name)
        if not text.isdigit() or int(text) < 1:
            raise RunnerError(f"{name}={text!r}: expected a positive integer")
        return int(text)

    def _sandbox_paths(self) -> dict[str, list[str]]:
        """What no agent may see (:func:`execution.sandbox.checks.refusals`' arguments):
        ``masked`` (the spool, credential and price files, the runners' private
        directories: this runner's TMPDIR and, for Grid Engine's per-job TMPDIR, the
        directory holding every job's), ``state`` (``TCO_SANDBOX_MASK``) and ``shared``
        (``TCO_SANDBOX_SHARED``)."""
        from execution.sandbox.checks import runner_masked_paths

        masked = runner_masked_paths(spool=self.spool, credentials_file=self._credentials_file(),
                                     prices_file=self.environ.get("TCO_PRICES_FILE") or None)
        base = os.path.normpath(self._private_base())
        if self.private_dir:
            masked.append(self.private_dir)
        if base != "/":
            masked.append(base)
            parent = os.path.dirname(base)
            job = self.environ.get("JOB_ID", "")
            if job and os.path.basename(base).startswith(f"{job}.") and parent != "/":
                masked.append(parent)  # /tmp/<job>.<task>.<queue>: the other jobs' are its siblings

        def listed(name: str) -> list[str]:
            return [p for p in self.environ.get(name, "").split(":") if p.startswith("/")]

        return {"masked": masked, "state": listed("TCO_SANDBOX_MASK"), "shared": listed("TCO_SANDBOX_SHARED")}

    def _credentials_file(self) -> str:
        return self.environ.get("TCO_CREDENTIALS_FILE") or SpoolLayout(self.spool).credentials_path

    def _read_spec(self) -> dict:
        """The campaign's runner spec, checked by the spool contract (execution/spool.py), as its
        JSON mapping with ``inputs_file`` made absolute. Raises RunnerError."""
        path = self.layout.spec_path(self.campaign_id)
        try:
            spec = RunnerSpec.read(path)
        except OSError as exc:
            raise RunnerError(f"cannot read runner spec {path}: {exc.strerror}") from exc
        except SpecError as exc:
            raise RunnerError(f"runner spec {path}: {exc}") from exc
        # The launcher may write the id as a number; the environment always has text.
        if isinstance(spec.campaign_id, bool) or str(spec.campaign_id) != self.campaign_id:
            raise RunnerError(f"runner spec {path} is for campaign {spec.campaign_id!r}, "
                              f"not {self.campaign_id!r}")
        if spec.kill_grace_s is not None:
            self.kill_grace_s = float(spec.kill_grace_s)
        data = spec.to_json()
        # Relative to the campaign folder; absolute paths stay as they are.
        data["inputs_file"] = os.path.join(self.layout.campaign_dir(self.campaign_id), spec.inputs_file)
        return data

    def _read_input(self, inputs_file: str) -> str:
        try:
            with open(inputs_file, encoding="utf-8") as fh:
                for number, line in enumerate(fh, start=1):
                    if number == self.task_number:
                        break
                else:
                    raise RunnerError(f"{inputs_file} has no line {self.task_number}")
        except OSError as exc:
            raise RunnerError(f"cannot read inputs file {inputs_file}: {exc.strerror}") from exc
        line = line.rstrip("\n")
        try:
            json.loads(line)
        except ValueError as exc:
            raise RunnerError(f"{inputs_file} line {self.task_number} is not JSON: {exc}") from exc
        return line

    def _load_policy(self, spec: dict):
        from execution.sandbox.policy import PolicyError, load_policy

        source = spec.get("policy")
        try:
            policy = load_policy(default_policy() if source in (None, "") else source)
        except PolicyError as exc:
            raise RunnerError(str(exc)) from exc
        return policy

    def _runtime(self, spec: dict, policy) -> str:
        wanted = self.environ.get("TCO_SANDBOX_RUNTIME") or (spec.get("sandbox") or {}).get("runtime") or "auto"
        if wanted not in ("auto", "bubblewrap", "openshell"):
            raise RunnerError(f"sandbox runtime {wanted!r}: use auto, bubblewrap or openshell")
        if wanted == "auto":
            loopback = any(e.loopback for _, e in policy.endpoints())
            from execution.sandbox.bwrap import which

            wanted = "openshell" if which("openshell", self.environ.get("PATH")) and not loopback else "bubblewrap"
        return wanted

    def _proxy_setup(self, spec: dict, policy) -> None:
        """Work out the proxy's endpoints, upstreams, registered endpoints and limits (it is
        started later). Only registered endpoints ever get a credential (module doc)."""
        from urllib.parse import urlsplit

        from execution.metering.endpoints import Limits, RegisteredEndpoint, registered_endpoints

        try:
            registered = registered_endpoints(spec.get("model_endpoints"))
        except ValueError as exc:
            raise RunnerError(f"runner spec: {exc}") from None
        upstreams: dict[str, str] = {}
        for entry in registered:
            upstreams.setdefault(f"{entry.host}:{entry.port}", f"{entry.scheme}://{entry.host}:{entry.port}")
        endpoint = spec.get("model_endpoint") or {}
        base_url, credential = endpoint.get("base_url"), endpoint.get("credential_name")
        if base_url is not None:
            parts = urlsplit(base_url) if isinstance(base_url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                raise RunnerError(f"model_endpoint.base_url {base_url!r} is not an http(s) URL")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            matches = [e for r, e in policy.endpoints() if r.binaries and e.protocol == "rest"
                       and e.host and e.host.lower() == parts.hostname.lower() and port in e.ports]
            if not matches:
                raise RunnerError(f"model_endpoint.base_url {base_url}: {parts.hostname}:{port} is not a "
                                  "protocol: rest endpoint of the sandbox policy")
            upstreams[f"{matches[0].host}:{port}"] = base_url.rstrip("/")
            if credential is not None:
                if not isinstance(credential, str) or not credential:
                    raise RunnerError("model_endpoint.credential_name must be a name")
                registered.append(RegisteredEndpoint(
                    name="model_endpoint", provider=None, scheme=parts.scheme, host=parts.hostname, port=port,
                    path_prefixes=(parts.path.rstrip("/") or "/",), credential_name=credential))
        elif credential is not None:
            raise RunnerError("model_endpoint.credential_name needs model_endpoint.base_url")
        if spec.get("credentials"):
            self.sandbox_info["notes"].append("spec credentials: ignored; only registered model endpoints "
                                              "(model_endpoints) receive a credential")
        self.sandbox_info["notes"] += _unregistered_notes(policy, registered, upstreams)
        token_cap, cost_cap = spec.get("token_cap"), spec.get("cost_cap_usd")
        if token_cap is not None and (isinstance(token_cap, bool) or not isinstance(token_cap, int) or token_cap < 1):
            raise RunnerError("runner spec: token_cap must be a positive number of tokens")
        if cost_cap is not None:
            from decimal import Decimal, InvalidOperation

            try:
                cost_cap = Decimal(str(cost_cap))
            except InvalidOperation:
                raise RunnerError("runner spec: cost_cap_usd must be a decimal amount of USD") from None
            if not cost_cap.is_finite() or cost_cap <= 0:
                raise RunnerError("runner spec: cost_cap_usd must be a positive amount of USD")
        prices = self.environ.get("TCO_PRICES_FILE") or self.layout.prices_path
        prices = prices if os.path.isfile(prices) else None
        if cost_cap is not None and prices is None:
            raise RunnerError("runner spec: cost_cap_usd needs a price table (TCO_PRICES_FILE or "
                              "<spool>/prices.json)")
        limits = Limits(**{field: self._limit(name) for name, field in PROXY_LIMITS.items()
                           if self._limit(name) is not None})
        self._proxy_config = {"policy": policy.proxy_policy(), "upstreams": upstreams, "registered": registered,
                              "file": self._credentials_file(), "prices": prices, "token_cap": token_cap,
                              "cost_cap": cost_cap, "limits": limits, "policy_version": 0}
        self._network_setup(spec, policy)

    # ---- the live network policy (module doc)
    def _network_setup(self, spec: dict, policy) -> None:
        """Take the ceilings the spec carries, apply the network policy file present now (before
        the agent starts) and start watching it."""
        ceilings = spec.get("network_ceilings") or []
        if not isinstance(ceilings, list) or not all(
                isinstance(c, dict) and isinstance(c.get("network_policies"), dict) for c in ceilings):
            raise RunnerError("runner spec: network_ceilings must be a list of {label, network_policies}")
        self._netpol_base = policy
        self._netpol_ceilings = [(str(c.get("label") or "ceiling"), {"network_policies": c["network_policies"]})
                                 for c in ceilings] or [("the launch policy", policy)]
        self.sandbox_info["network_policy"] = {"version": 0, "changes": []}
        path = self.layout.network_policy_path(self.campaign_id)
        self._netpol_watch = _NetworkPolicyWatch(path, NETWORK_POLICY_POLL_S, self._network_changed)
        self._network_changed()
        self._netpol_watch.start()

    def _network_note(self, version, error: str | None) -> None:
        info = self.sandbox_info["network_policy"]
        if len(info["changes"]) >= MAX_NETWORK_CHANGES_NOTED:
            info["changes_not_noted"] = info.get("changes_not_noted", 0) + 1
            return
        info["changes"].append({"version": version, "at": self.clock.iso(), "applied": error is None,
                                "error": error})

    def _network_changed(self) -> None:
        """Read the campaign's network policy file; apply a higher version that passes the checks,
        note a refused one (the rules in force stay). Never raises."""
        from execution.spool import NetworkPolicyFile, NetworkPolicyFileError

        try:
            changed = NetworkPolicyFile.read(self.layout.network_policy_path(self.campaign_id))
        except FileNotFoundError:
            return
        except (OSError, NetworkPolicyFileError) as exc:
            self._network_note(None, f"network policy file refused: {exc}"[:500])
            return
        version = changed.policy_version
        if version <= self._netpol_seen:
            return
        self._netpol_seen = version
        if str(changed.campaign_id) != str(self.campaign_id):
            self._network_note(version, f"network policy file names campaign {changed.campaign_id}")
            return
        try:
            self._network_apply(changed.network_policies, version)
        except Exception as exc:  # noqa: BLE001 - refused: the previous rules stay
            self._network_note(version, str(exc)[:1000])
        else:
            self._network_note(version, None)

    def _network_apply(self, network_policies: dict, version: int) -> None:
        """Check ``network_policies`` (execution/sandbox/live_network.py) and make it the rules the
        proxy routes new requests by. Raises PolicyError, ValueError (refused; nothing changed)."""
        from execution.sandbox.live_network import network_problems, with_network
        from execution.sandbox.policy import PolicyError

        policy = with_network(self._netpol_base, network_policies)
        problems = network_problems(policy, self._netpol_ceilings)
        if problems:
            raise PolicyError(["wider than allowed: " + "; ".join(problems)])
        proxy_policy = policy.proxy_policy()
        config = self._proxy_config
        from execution.metering.endpoints import endpoints_from_policy

        endpoints = endpoints_from_policy(proxy_policy, config["upstreams"])
        with self._netpol_lock:
            config["policy"], config["policy_version"] = proxy_policy, version
            if self._proxy_handle is not None:
                self._proxy_handle.replace_endpoints(endpoints, version)
        self.sandbox_info["network_policy"]["version"] = version

    def _private_base(self) -> str:
        base = self.environ.get("TMPDIR") or "/tmp"
        return base if os.path.isabs(base) and os.path.isdir(base) else "/tmp"

    def _make_private_dir(self) -> str:
        base = self._private_base()
        for attempt in range(100):
            path = os.path.join(base, f"tco-runner-{os.getpid()}-{attempt}")
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue
        raise RunnerError(f"cannot make a private directory in {base}")

    def _agent_env(self, spec: dict, relay_port: int) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": INSIDE_WORKDIR, "USER": "sandbox",
               "LOGNAME": "sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        for key in PASSED_THROUGH_ENV:
            if key in self.environ:
                env[key] = self.environ[key]
        base = f"http://127.0.0.1:{relay_port}"
        env.update(ANTHROPIC_BASE_URL=base, OPENAI_BASE_URL=f"{base}/v1", ANTHROPIC_API_KEY=PLACEHOLDER_KEY,
                   OPENAI_API_KEY=PLACEHOLDER_KEY)
        if isinstance(spec.get("model"), str) and spec["model"]:
            env["TCO_MODEL"] = spec["model"]
        env.update(spec["agent"].get("environment") or {})
        env.update(TCO_CAMPAIGN_ID=self.campaign_id, TCO_TASK_NUMBER=str(self.task_number),
                   TCO_INPUT_FILE=f"{INSIDE_WORKDIR}/input.json", TCO_WORK_DIR=INSIDE_WORKDIR)
        return env

    # ---- the agent
    def _start_agent(self, spec: dict) -> None:
        from execution.sandbox.checks import refusals

        policy = self._load_policy(spec)
        runtime = self._runtime(spec, policy)
        paths = self._sandbox_paths()
        # The launch form calls the same function: a policy refused here is refused there.
        refused = refusals(policy, masked_paths=paths["masked"], state_paths=paths["state"],
                           shared_paths=paths["shared"], runtime=runtime, registered=_registered_hosts(spec))
        if refused:
            raise RunnerError("the runner refuses this sandbox policy: " + "; ".join(refused))
        findings = policy.unenforceable() if runtime == "bubblewrap" else []
        self.sandbox_info = {"runtime": runtime, "policy_sha256": policy.sha256, "uid": policy.uid,
                             "gid": policy.gid, "notes": [str(f) for f in findings], "log": ""}

        self.work_dir = self.layout.work_dir(self.campaign_id, self.task_number)
        os.makedirs(self.work_dir, mode=0o700, exist_ok=True)
        input_text = self._read_input(spec["inputs_file"]) + "\n"
        input_path = os.path.join(self.work_dir, "input.json")
        # A previous attempt's agent may have left a link here: never write through it.
        if os.path.lexists(input_path):
            os.unlink(input_path)
        fd = os.open(input_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(input_text)
        argv = [a.replace("{input}", f"{INSIDE_WORKDIR}/input.json").replace("{workdir}", INSIDE_WORKDIR)
                for a in spec["agent"]["command"]]
        self.private_dir = self._make_private_dir()

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            if runtime == "openshell":
                self.flags.append("unmetered_runtime")
                self._start_openshell(spec, policy, argv, out_w, err_w)
            else:
                self._start_bwrap(spec, policy, argv, out_w, err_w)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        from execution.sandbox import SandboxStartError

        # Output files appear once the agent runs (stdout_path is null if it never did); the
        # pipes hold what it writes meanwhile.
        try:
            self._arm()
            self.sandbox.wait_ready()
        except SandboxStartError as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            raise RunnerError(str(exc)) from exc
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            self._armed = False
        for fd, suffix in ((out_r, "stdout"), (err_r, "stderr")):
            capture = _Capture(fd, self._output_path(suffix), self.output_cap)
            capture.start()
            self.captures.append(capture)
        self._note_stages()

    def _start_bwrap(self, spec: dict, policy, argv: list[str], out_w: int, err_w: int) -> None:
        from execution.sandbox.bwrap import (RELAY_PORT, BwrapSandbox, SandboxConfigError, SandboxPlan,
                                          SandboxStartError, group_text, passwd_text)

        self._proxy_setup(spec, policy)
        socket_dir = os.path.join(self.private_dir, "sock")
        os.mkdir(socket_dir, 0o700)
        paths = self._sandbox_paths()
        status_r, status_w = os.pipe()
        json_r, json_w = os.pipe()
        data_fds = {}
        for inside, text in (("/etc/passwd", passwd_text(policy.uid, policy.gid)),
                             ("/etc/group", group_text(policy.gid))):
            r, w = os.pipe()
            os.write(w, text.encode())
            os.close(w)
            data_fds[inside] = r
        watch_fd = os.open(f"/proc/{os.getpid()}/stat", os.O_RDONLY)
        ours = [status_w, json_w, watch_fd, *data_fds.values()]
        try:
            plan = SandboxPlan(
                policy=policy, workdir=self.work_dir, socket_dir=socket_dir, agent_argv=argv,
                env=self._agent_env(spec, RELAY_PORT), masks=paths["masked"], state=paths["state"],
                shared=paths["shared"], interpreter=sys.executable, status_fd=status_w, json_status_fd=json_w,
                stdout_fd=out_w, stderr_fd=err_w, data_fds=data_fds, watch_fd=watch_fd,
                tmpfs_bytes=self._limit("TCO_SANDBOX_TMPFS_BYTES"),
                max_processes=self._limit("TCO_SANDBOX_MAX_PROCESSES"))
            try:
                self.sandbox = BwrapSandbox(plan, on_proxy_wanted=self._start_proxy_soon)
            except SandboxConfigError as exc:
                raise RunnerError(str(exc)) from exc
            self.sandbox_info["notes"] += plan.notes
            self._armed = False  # never interrupt between fork and bookkeeping
            try:
                self.sandbox.start(status_r, json_r)
            except SandboxStartError as exc:
                raise RunnerError(str(exc)) from exc
        except BaseException:
            if self.sandbox is None or self.sandbox.proc is None:
                for fd in (status_r, json_r):
                    os.close(fd)
            raise
        finally:
            for fd in ours:
                os.close(fd)
        self.stages["sandbox_create_at"] = self.clock.iso_mono(self.sandbox.mono.get("create"))

    def _start_openshell(self, spec: dict, policy, argv: list[str], out_w: int, err_w: int) -> None:
        from execution.sandbox.openshell import OpenShellSandbox, SandboxStartError

        name = f"tco-{self.campaign_id}-{self.task_number}-{self.job_number or os.getpid()}".replace("_", "-")
        endpoint = spec.get("model_endpoint") or {}
        env = self._agent_env(spec, 0)
        # Under OpenShell the agent talks to the endpoint itself, through OpenShell's proxy.
        for key in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
            env.pop(key, None)
        if endpoint.get("base_url"):
            env["ANTHROPIC_BASE_URL"] = endpoint["base_url"]
        self.sandbox = OpenShellSandbox(policy=policy, name=name, workdir=self.work_dir, agent_argv=argv,
                                        env=env, stdout_fd=out_w, stderr_fd=err_w, private_dir=self.private_dir)
        self._armed = True
        try:
            self.sandbox.start()
        except SandboxStartError as exc:
            raise RunnerError(str(exc)) from exc
        finally:
            self._armed = False
        self.stages["sandbox_create_at"] = self.clock.iso_mono(self.sandbox.mono.get("create"))

    def _note_stages(self) -> None:
        mono = self.sandbox.mono
        self.stages["sandbox_create_at"] = self.clock.iso_mono(mono.get("create"))
        self.stages["sandbox_ready_at"] = self.clock.iso_mono(mono.get("ready"))
        self.stages["agent_started_at"] = self.clock.iso_mono(mono.get("started"))

    def _check_interval(self) -> float:
        text = self.environ.get("TCO_SANDBOX_WORK_CHECK_S")
        if text in (None, ""):
            return float(LIMIT_DEFAULTS["TCO_SANDBOX_WORK_CHECK_S"])
        try:
            value = float(text)
        except ValueError:
            value = 0.0
        if not value > 0 or value != value or value == float("inf"):
            raise RunnerError(f"TCO_SANDBOX_WORK_CHECK_S={text!r}: expected a positive number of seconds")
        return value

    def _on_workdir_over(self) -> None:
        """From the work directory watch: stop the agent as a timeout would."""
        self.workdir_over = True
        os.kill(os.getpid(), signal.SIGALRM)

    def _wait_agent(self, timeout_s: float | None) -> None:
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        if self.work_dir is not None:
            self._workdir_watch = _WorkdirWatch(self.work_dir, self._limit("TCO_SANDBOX_WORK_BYTES"),
                                                self._check_interval(), self._on_workdir_over)
            self._workdir_watch.start()
        self._arm()
        self.sandbox.wait_exit()
        self._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._set_agent_status()
        self.stages["agent_exited_at"] = self.clock.iso_mono(self.sandbox.mono.get("exited")) \
            or self.clock.iso()

    def _set_agent_status(self) -> None:
        sandbox = self.sandbox
        if sandbox is None or sandbox.proc is None:
            return
        if sandbox.exit is not None:
            kind, value = sandbox.exit
        elif sandbox.killed:
            kind, value = "signal", signal.SIGKILL
        elif sandbox.proc.returncode is not None:
            kind, value = "code", sandbox.proc.returncode
        else:
            return
        if kind == "signal":
            self.agent_signal, self.exit_status = value, None
        else:
            self.agent_signal, self.exit_status = None, value

    # ---- the proxy
    def _start_proxy_soon(self) -> None:
        """The agent wants its base URL: start the proxy in a thread (importing aiohttp takes
        a while; the relay retries its connection meanwhile)."""
        if self._proxy_thread is not None or self._proxy_config is None:
            return
        self.requests_path = self._output_path("requests.jsonl")
        self._proxy_thread = threading.Thread(target=self._run_proxy_start, name="tco-proxy-start", daemon=True)
        self._proxy_thread.start()

    def _run_proxy_start(self) -> None:
        try:
            from execution.metering.proxy import CredentialError, CredentialResolver, start_proxy

            config = self._proxy_config
            path = config["file"]

            class NamedCredentials(CredentialResolver):
                """Credentials by name from the runner's credentials file (JSON
                ``{"name": "secret"}``), read at the first request that needs one. The proxy
                asks only for names of registered model endpoints."""

                def __init__(self) -> None:
                    super().__init__({})
                    self._secrets: dict[str, str] = {}

                def resolve(self, name: str) -> str:
                    if name in self._secrets:
                        return self._secrets[name]
                    try:
                        with open(path, encoding="utf-8") as fh:
                            table = json.load(fh)
                    except (OSError, ValueError) as exc:
                        raise CredentialError(f"credentials file unreadable: {type(exc).__name__}") from None
                    value = table.get(name) if isinstance(table, dict) else None
                    if not isinstance(value, str) or not value.strip():
                        raise CredentialError(f"credential {name!r} is not in the credentials file")
                    self._secrets[name] = value.strip()
                    return self._secrets[name]

            prices = None
            if config["prices"] is not None:
                from execution.metering.prices import PriceTable

                prices = PriceTable.from_file(config["prices"])
            caps = None
            if config["token_cap"] is not None or config["cost_cap"] is not None:
                from execution.metering.proxy import Caps

                caps = Caps(task_tokens=config["token_cap"], task_cost_usd=config["cost_cap"])
            with self._netpol_lock:  # a network policy change waits: the proxy starts with the rules in force
                self._proxy_handle = start_proxy(
                    os.path.join(self.private_dir, "sock", "proxy.sock"), config["policy"], NamedCredentials(),
                    caps=caps, prices=prices, upstreams=config["upstreams"], record_path=self.requests_path,
                    registered=config["registered"], limits=config["limits"],
                    policy_version=config["policy_version"])
        except Exception as exc:  # noqa: BLE001 - recorded; the agent sees its connection refused
            self._proxy_error = f"metering proxy did not start: {type(exc).__name__}: {exc}"

    def _stop_proxy(self) -> None:
        if self._proxy_thread is None:
            return
        self._proxy_thread.join(PROXY_STOP_S)
        if self._proxy_handle is not None:
            try:
                self.usage = self._proxy_handle.stop(timeout=PROXY_STOP_S)
            except Exception as exc:  # noqa: BLE001
                self._proxy_error = self._proxy_error or f"metering proxy did not stop: {exc!r}"
                try:
                    self.usage = self._proxy_handle.proxy.totals()
                except Exception:  # noqa: BLE001
                    self.usage = None
        elif self._proxy_error is None:
            self._proxy_error = "metering proxy did not start in time"
        if self._proxy_error:
            self._flag("proxy_error")
            self.error = self.error or self._proxy_error

    # ---- teardown
    def _terminate_group(self) -> None:
        """SIGTERM every other process of our group, wait, SIGKILL the rest (nothing of the
        sandbox is in it; this catches anything else the runner may have left)."""
        if not _group_members():
            return
        # killpg reaches the runner too; it is tearing down already.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + self.kill_grace_s
        while time.monotonic() < deadline and _group_members():
            time.sleep(0.02)
        for pid in _group_members():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _copy_outputs(self, patterns: list[str]) -> None:
        import glob

        names: list[str] = []
        for pattern in patterns:
            if any(ch in pattern for ch in "*?["):
                names += sorted(glob.glob(pattern, root_dir=self.work_dir))
            else:
                names.append(pattern)
        seen = set()
        target_dir = self.layout.outputs_dir(self.campaign_id, self.task_number)
        for name in names:
            name = os.path.normpath(name)
            if name in seen:
                continue
            seen.add(name)
            if len(self.outputs) >= MAX_OUTPUT_FILES:
                self._flag("outputs_skipped")
                break
            try:
                fd = _open_beneath(self.work_dir, name)
            except OSError:
                if not os.path.lexists(os.path.join(self.work_dir, name)):
                    continue  # not written: nothing to show
                self._flag("outputs_skipped")
                continue
            with os.fdopen(fd, "rb") as src:
                if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                    self._flag("outputs_skipped")
                    continue
                data = src.read(OUTPUT_FILE_CAP_BYTES + 1)
            os.makedirs(target_dir, mode=0o700, exist_ok=True)
            target = os.path.join(target_dir, name.replace("/", "__"))
            with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
                           "wb") as out:
                out.write(data[:OUTPUT_FILE_CAP_BYTES])
            self.outputs.append({"name": name, "path": target, "bytes": min(len(data), OUTPUT_FILE_CAP_BYTES),
                                 "truncated": len(data) > OUTPUT_FILE_CAP_BYTES})

    def _flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def _write_usage_file(self) -> str | None:
        """The task's token totals as ``tco_<key>=<number>`` lines in ``<task>.usage``.

        For OCS/GCS 9 flexible accounting: the shepherd's usage file belongs to
        the admin user, so the runner cannot write it; the epilog
        ``execution/usage_epilog.py`` (run as that user) appends this file to it.
        Returns the path, or None without totals or when it cannot be written.
        """
        if not self.usage or self.record_dir is None:
            return None
        from execution.metering.usage import append_usage_file

        path = self._output_path("usage")
        try:
            if os.path.exists(path):
                os.unlink(path)
            append_usage_file(path, self.usage)
        except (OSError, ValueError) as exc:
            self._flag("usage_file_error")
            print(f"tco runner: usage file not written: {exc}", file=sys.stderr)
            return None
        return path

    def _output_path(self, suffix: str) -> str:
        return self.layout.task_file(self.campaign_id, self.task_number, suffix)

    # ---- the whole run
    def run(self) -> int:
        """Run the task; always try to write a record. Returns the runner's exit status."""
        self._install_signal_handlers()
        spec = None
        try:
            if os.getpgrp() != os.getpid():
                os.setpgid(0, 0)
            self._arm()
            self._read_environment()
            spec = self._read_spec()
            self._armed = False
            self._start_agent(spec)
            self._wait_agent(spec.get("timeout_s"))
        except RunnerError as exc:
            self.error, self.exit_code = str(exc), EXIT_CONFIG
            self.flags.append("runner_error")
        except _Interrupted:
            pass
        except Exception as exc:  # noqa: BLE001 - a runner bug must still leave a record
            self.error, self.exit_code = f"internal error: {exc!r}", EXIT_INTERNAL
            self.flags.append("runner_error")
        finally:
            self._armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        return self._finish(spec)

    def _finish(self, spec: dict | None) -> int:
        self._armed = False
        if self.sandbox is not None:
            # After a signal the scheduler's SIGKILL may follow soon: the record must be out first.
            grace = min(self.kill_grace_s, SIGNALLED_GRACE_S) if self.runner_signal is not None \
                else self.kill_grace_s
            try:
                self.sandbox.stop(grace)
            except Exception as exc:  # noqa: BLE001
                self._flag("runner_error")
                self.error = self.error or f"sandbox teardown failed: {exc!r}"
            if self.stages["agent_exited_at"] is None:
                self._set_agent_status()
            if self.stages["agent_started_at"] is None:
                self._note_stages()
            if self.sandbox_info is not None:
                self.sandbox_info["log"] = self.sandbox.log()
        try:
            self._terminate_group()
        except Exception as exc:  # noqa: BLE001
            self._flag("runner_error")
            self.error = self.error or f"teardown failed: {exc!r}"
        if self._workdir_watch is not None:
            self._workdir_watch.done.set()
        if self._netpol_watch is not None:
            self._netpol_watch.done.set()
            if self._netpol_watch.is_alive():
                self._netpol_watch.join(PROXY_STOP_S)
        if self.work_dir is not None and self.stages["agent_started_at"] is not None:
            try:
                work_bytes = _tree_bytes(self.work_dir)
                if self.sandbox_info is not None:
                    self.sandbox_info["work_bytes"] = work_bytes
                if work_bytes > self._limit("TCO_SANDBOX_WORK_BYTES"):
                    self.workdir_over = True
            except RunnerError:
                pass
        if self.workdir_over:
            self._flag("workdir_over_quota")
        for capture in self.captures:
            capture.join(OUTPUT_DRAIN_S)
            if capture.is_alive():
                self.flags.append("output_incomplete")
                break
        self._stop_proxy()
        if spec is not None and self.work_dir is not None and self.stages["agent_started_at"] is not None:
            try:
                self._copy_outputs(spec["agent"].get("outputs") or [])
            except OSError as exc:
                self._flag("outputs_skipped")
                self.error = self.error or f"could not copy outputs: {exc}"
        if self.private_dir is not None:
            _remove_tree(self.private_dir)
        if self.timed_out and self.stages["agent_exited_at"] is None:
            self.flags.append("agent_timeout")
        if self.runner_signal is not None:
            self.flags.append("runner_signalled")
        self.stages["teardown_done_at"] = self.clock.iso()

        if "runner_error" not in self.flags:
            if self.stages["agent_exited_at"] is not None:  # ended by itself: its status
                self.exit_code = self.exit_status if self.agent_signal is None else 128 + self.agent_signal
            elif self.runner_signal is not None:
                self.exit_code = 128 + self.runner_signal
            elif self.workdir_over:
                self.exit_code = EXIT_WORKDIR_QUOTA
            elif self.timed_out:
                self.exit_code = EXIT_TIMEOUT
        if self.exit_code in (99, 100):  # Grid Engine: reschedule / error state
            self.exit_code = 101
        if self.record_dir is None:
            print(f"tco runner: {self.error}; no record written", file=sys.stderr)
            return self.exit_code
        usage_file = self._write_usage_file()
        record = RunnerRecord(
            campaign_id=self.campaign_id,
            task_number=self.task_number,
            job_number=self.job_number,
            hostname=os.uname().nodename,
            stages=self.stages,
            exit_status=self.exit_status,
            signal=self.agent_signal,
            stdout_path=self._output_path("stdout") if self.captures else None,
            stderr_path=self._output_path("stderr") if self.captures else None,
            stdout_truncated=bool(self.captures and self.captures[0].truncated),
            stderr_truncated=bool(len(self.captures) > 1 and self.captures[1].truncated),
            outputs=self.outputs,
            sandbox=self.sandbox_info,
            usage=self.usage,
            requests_path=self.requests_path if self._proxy_thread is not None else None,
            usage_file=usage_file,
            flags=self.flags,
            runner_signal=self.runner_signal,
            error=self.error,
        )
        try:
            record.write(self.layout.record_path(self.campaign_id, self.task_number))
        except OSError as exc:
            print(f"tco runner: cannot write record: {exc}", file=sys.stderr)
            return EXIT_INTERNAL
        if self.error:
            print(f"tco runner: {self.error}", file=sys.stderr)
        return self.exit_code


def main() -> int:
    """Entry point: run the task described by the environment; return the exit status.

    The umask is 077 first: what the runner, its proxy and its agent write in the
    spool (records, logs, request records, work directory, outputs) is the submit
    account's alone (files 0600, directories 0700), whatever umask Grid Engine gave."""
    os.umask(0o077)
    return Runner(os.environ).run()


if __name__ == "__main__":
    sys.exit(main())
