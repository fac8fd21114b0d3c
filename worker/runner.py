"""The runner: what Grid Engine starts for each agent task (``python -m worker.runner``).

Standard library only, no Django: it starts on every task and must be quick.

Environment (set at launch; ``JOB_ID``/``SGE_TASK_ID`` come from Grid Engine):
``TCO_SPOOL_DIR``, ``TCO_CAMPAIGN_ID``, ``JOB_ID``, ``SGE_TASK_ID`` (the
string ``undefined`` for a non-array job; the runner then uses task 1 and
flags ``task_number_defaulted``).

Files under the spool directory:

- reads ``campaigns/<campaign_id>/spec.json`` (the runner spec):
  ``{"version": 1, "campaign_id": str|int, "agent": {"command": [argv...]},
  "inputs_file": path, "timeout_s": number|null}``. ``{input}`` and
  ``{workdir}`` in the command are replaced by the task's input file and
  work directory. ``inputs_file`` is JSONL, line N (1-based) is task N's
  input; a relative path is relative to the campaign directory. Optional
  ``kill_grace_s`` (default :data:`KILL_GRACE_S`): seconds between SIGTERM
  and SIGKILL when the agent is stopped.
- creates ``work/<campaign_id>/<task_number>/`` (the agent's cwd; its input
  is copied to ``input.json`` there).
- writes ``records/<campaign_id>/<task_number>.stdout`` / ``.stderr``
  (the agent's output, each capped at :data:`OUTPUT_CAP_BYTES`) and, last,
  ``records/<campaign_id>/<task_number>.json`` atomically (temp file,
  fsync, ``os.replace``): the runner record, version 1::

    {"version": 1, "campaign_id": str, "task_number": int, "job_number": int|null,
     "hostname": str,
     "stages": {"task_started_at", "sandbox_create_at", "sandbox_ready_at",
                "agent_started_at", "agent_exited_at", "teardown_done_at"},
     "exit_status": int|null, "signal": int|null,
     "stdout_path": str|null, "stderr_path": str|null,
     "stdout_truncated": bool, "stderr_truncated": bool,
     "flags": [str], "runner_signal": int|null, "error": str|null}

  (``stdout_path``/``stderr_path`` are null when the agent never started.)

Stages are UTC ISO-8601 strings with microseconds and a ``Z`` (or null when
not reached), from a monotonic clock anchored to UTC when the module is
loaded, so they are ordered even if the wall clock steps. ``sandbox_*`` stay
null until the sandbox exists. ``agent_started_at`` is taken when the agent
process has been created (fork and exec done). ``agent_exited_at`` is set
only when the agent ended by itself; when the runner stops it (signal to the
runner, timeout) it stays null and ``teardown_done_at`` says when it was gone.

``exit_status``/``signal`` describe the agent process (``signal`` when it
died of one, including the runner's own SIGTERM/SIGKILL at teardown).
``runner_signal`` is the signal that interrupted the runner. Flags:
``runner_error`` (see ``error``), ``runner_signalled``, ``agent_timeout``,
``output_incomplete`` (a stray process kept an output pipe open),
``task_number_defaulted``.

The runner's exit status is the agent's; 128+N when the agent died of
signal N or the runner was interrupted by signal N; :data:`EXIT_TIMEOUT` on
timeout; :data:`EXIT_CONFIG` when it could not start the agent (bad
environment, spec or input); :data:`EXIT_INTERNAL` on a runner bug. (99 and
100 mean "reschedule" and "error state" to Grid Engine and are never used.)

Processes: the runner makes itself a process-group leader if Grid Engine
has not (its shepherd normally has), and starts the agent in that same
group, so the shepherd's signals (suspend SIGSTOP, qdel SIGKILL) reach the
agent too. On SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU (each of
which would otherwise kill the runner without a record; Grid Engine sends
SIGUSR1/SIGXCPU for soft limits) the runner sends SIGTERM to its group,
waits :data:`KILL_GRACE_S`, SIGKILLs what is left, and writes the record.
SIGKILL cannot be caught: a task killed outright (qdel with the default
``terminate_method``) leaves no record.
"""
from __future__ import annotations

import time

# Anchor the stage clock before anything else is imported: task_started_at is
# the runner's first timestamp, and queue wait is measured up to it.
_ANCHOR_WALL_NS = time.time_ns()
_ANCHOR_MONO_NS = time.monotonic_ns()

import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

RECORD_VERSION = 1
SPEC_VERSION = 1
OUTPUT_CAP_BYTES = 1 << 20
KILL_GRACE_S = 5.0
OUTPUT_DRAIN_S = 2.0
EXIT_TIMEOUT = 124
EXIT_CONFIG = 78
EXIT_INTERNAL = 70

TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                       signal.SIGUSR2, signal.SIGXCPU)
STAGES = ("task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at",
          "agent_exited_at", "teardown_done_at")
_CAMPAIGN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class RunnerError(Exception):
    """The runner could not start the agent (environment, spec or input is wrong)."""


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
        return self._wall_ns + (time.monotonic_ns() - self._mono_ns)

    def anchor_iso(self) -> str:
        """The anchor itself as ISO text (``task_started_at``)."""
        return self.iso(self._wall_ns)

    def iso(self, ns: int | None = None) -> str:
        """``2025-01-02T03:04:05.123456Z`` for ``ns`` (default now)."""
        ns = self.now_ns() if ns is None else ns
        seconds, rest = divmod(ns, 1_000_000_000)
        moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).replace(microsecond=rest // 1000)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Capture(threading.Thread):
    """Copy one pipe into a file, keeping at most ``cap`` bytes and draining the rest."""

    def __init__(self, pipe, path: str, cap: int) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.path = path
        self.cap = cap
        self.written = 0
        self.truncated = False

    def run(self) -> None:
        fd = self.pipe.fileno()
        with open(self.path, "wb") as out:
            while True:
                try:
                    chunk = os.read(fd, 65536)
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


def _write_json_atomically(path: str, data: dict) -> None:
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # some filesystems (NFS, tmpfs variants) refuse fsync on a directory
    finally:
        os.close(dir_fd)


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
        self.proc: subprocess.Popen | None = None
        self.captures: list[_Capture] = []
        self._armed = False

    # ---- signals
    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGALRM:
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
        if self.runner_signal is not None or self.timed_out:  # arrived while disarmed
            self._armed = False
            raise _Interrupted()

    # ---- setup
    def _read_environment(self) -> None:
        env = self.environ
        self.spool = env.get("TCO_SPOOL_DIR") or None
        self.campaign_id = env.get("TCO_CAMPAIGN_ID") or None
        if not self.spool or not os.path.isabs(self.spool):
            raise RunnerError("TCO_SPOOL_DIR must be set to an absolute path")
        if not self.campaign_id or not _CAMPAIGN_ID_RE.match(self.campaign_id) \
                or self.campaign_id in (".", ".."):
            raise RunnerError(f"TCO_CAMPAIGN_ID {self.campaign_id!r} is missing or not a safe name")
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
        self.record_dir = os.path.join(self.spool, "records", self.campaign_id)
        os.makedirs(self.record_dir, exist_ok=True)

    def _read_spec(self) -> dict:
        campaign_dir = os.path.join(self.spool, "campaigns", self.campaign_id)
        path = os.path.join(campaign_dir, "spec.json")
        try:
            with open(path, encoding="utf-8") as fh:
                spec = json.load(fh)
        except OSError as exc:
            raise RunnerError(f"cannot read runner spec {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise RunnerError(f"runner spec {path} is not JSON: {exc}") from exc
        if not isinstance(spec, dict) or spec.get("version") != SPEC_VERSION:
            raise RunnerError(f"runner spec {path}: version must be {SPEC_VERSION}")
        # The launcher may write the id as a number; the environment always has text.
        if isinstance(spec.get("campaign_id"), bool) or str(spec.get("campaign_id")) != self.campaign_id:
            raise RunnerError(f"runner spec {path} is for campaign {spec.get('campaign_id')!r}, "
                              f"not {self.campaign_id!r}")
        command = (spec.get("agent") or {}).get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise RunnerError(f"runner spec {path}: agent.command must be a non-empty list of strings")
        timeout = spec.get("timeout_s")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout <= 0):
            raise RunnerError(f"runner spec {path}: timeout_s must be a positive number or null")
        grace = spec.get("kill_grace_s", self.kill_grace_s)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
            raise RunnerError(f"runner spec {path}: kill_grace_s must be a number of seconds >= 0")
        self.kill_grace_s = float(grace)
        inputs = spec.get("inputs_file")
        if not isinstance(inputs, str) or not inputs:
            raise RunnerError(f"runner spec {path}: inputs_file must be a path")
        spec["inputs_file"] = os.path.join(campaign_dir, inputs)  # absolute paths stay as they are
        return spec

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

    # ---- the agent
    def _start_agent(self, spec: dict) -> None:
        self.work_dir = os.path.join(self.spool, "work", self.campaign_id, str(self.task_number))
        os.makedirs(self.work_dir, exist_ok=True)
        input_path = os.path.join(self.work_dir, "input.json")
        with open(input_path, "w", encoding="utf-8") as fh:
            fh.write(self._read_input(spec["inputs_file"]) + "\n")
        argv = [a.replace("{input}", input_path).replace("{workdir}", self.work_dir)
                for a in spec["agent"]["command"]]
        env = dict(self.environ)
        env.pop("TCO_SPOOL_DIR", None)  # the agent has no business in the spool
        env.update(TCO_TASK_NUMBER=str(self.task_number), TCO_INPUT_FILE=input_path,
                   TCO_WORK_DIR=self.work_dir)
        self._armed = False  # never interrupt Popen between fork and bookkeeping
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, cwd=self.work_dir, env=env)
        except OSError as exc:
            raise RunnerError(f"cannot start agent {argv[0]!r}: {exc.strerror or exc}") from exc
        self.stages["agent_started_at"] = self.clock.iso()
        for pipe, suffix in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            capture = _Capture(pipe, self._output_path(suffix), self.output_cap)
            capture.start()
            self.captures.append(capture)

    def _wait_agent(self, timeout_s: float | None) -> None:
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        self._arm()
        returncode = self.proc.wait()
        self._armed = False
        self.stages["agent_exited_at"] = self.clock.iso()
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._set_agent_status(returncode)

    def _set_agent_status(self, returncode: int) -> None:
        if returncode < 0:
            self.agent_signal, self.exit_status = -returncode, None
        else:
            self.agent_signal, self.exit_status = None, returncode

    def _terminate_group(self) -> None:
        """SIGTERM every other process of our group, wait, SIGKILL the rest, reap the agent."""
        if self.proc is not None and self.proc.poll() is None or _group_members():
            # killpg reaches the runner too; it is tearing down already.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                os.killpg(os.getpgrp(), signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + self.kill_grace_s
            while time.monotonic() < deadline:
                if self.proc is not None:
                    self.proc.poll()
                if not _group_members():
                    break
                time.sleep(0.02)
            for pid in _group_members():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc is not None and self.proc.returncode is None:
            self._set_agent_status(self.proc.wait())
        elif self.proc is not None and self.exit_status is None and self.agent_signal is None:
            self._set_agent_status(self.proc.returncode)

    def _output_path(self, suffix: str) -> str:
        return os.path.join(self.record_dir, f"{self.task_number}.{suffix}")

    # ---- the whole run
    def run(self) -> int:
        """Run the task; always try to write a record. Returns the runner's exit status."""
        self._install_signal_handlers()
        try:
            if os.getpgrp() != os.getpid():
                os.setpgid(0, 0)
            self._arm()
            self._read_environment()
            spec = self._read_spec()
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
        return self._finish()

    def _finish(self) -> int:
        try:
            self._terminate_group()
        except Exception as exc:  # noqa: BLE001
            self.flags.append("runner_error")
            self.error = self.error or f"teardown failed: {exc!r}"
        for capture in self.captures:
            capture.join(OUTPUT_DRAIN_S)
            if capture.is_alive():
                self.flags.append("output_incomplete")
                break
        if self.timed_out and self.stages["agent_exited_at"] is None:
            self.flags.append("agent_timeout")
        if self.runner_signal is not None:
            self.flags.append("runner_signalled")
        self.stages["teardown_done_at"] = self.clock.iso()

        if self.error is None:
            if self.stages["agent_exited_at"] is not None:  # ended by itself: its status
                self.exit_code = self.exit_status if self.agent_signal is None else 128 + self.agent_signal
            elif self.runner_signal is not None:
                self.exit_code = 128 + self.runner_signal
            elif self.timed_out:
                self.exit_code = EXIT_TIMEOUT
        if self.exit_code in (99, 100):  # Grid Engine: reschedule / error state
            self.exit_code = 101
        if self.record_dir is None:
            print(f"tco runner: {self.error}; no record written", file=sys.stderr)
            return self.exit_code
        record = {
            "version": RECORD_VERSION,
            "campaign_id": self.campaign_id,
            "task_number": self.task_number,
            "job_number": self.job_number,
            "hostname": socket.gethostname(),
            "stages": self.stages,
            "exit_status": self.exit_status,
            "signal": self.agent_signal,
            "stdout_path": self._output_path("stdout") if self.captures else None,
            "stderr_path": self._output_path("stderr") if self.captures else None,
            "stdout_truncated": bool(self.captures and self.captures[0].truncated),
            "stderr_truncated": bool(len(self.captures) > 1 and self.captures[1].truncated),
            "flags": self.flags,
            "runner_signal": self.runner_signal,
            "error": self.error,
        }
        try:
            _write_json_atomically(os.path.join(self.record_dir, f"{self.task_number}.json"), record)
        except OSError as exc:
            print(f"tco runner: cannot write record: {exc}", file=sys.stderr)
            return EXIT_INTERNAL
        if self.error:
            print(f"tco runner: {self.error}", file=sys.stderr)
        return self.exit_code


def main() -> int:
    """Entry point: run the task described by the environment; return the exit status."""
    return Runner(os.environ).run()


if __name__ == "__main__":
    sys.exit(main())
