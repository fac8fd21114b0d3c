"""One task's run: :class:`Runner` and :func:`main` (what ``python -m execution.runner`` calls).

The run's order, its signals, stages, teardown and the record it leaves are
described in docs/runner.md; the parts are in the sibling modules (config,
task, proxy_start, network, sandbox_start, outputs, teardown).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from execution.runner.clock import StageClock
from execution.runner.config import (SPEC_LIMITS, EXIT_CONFIG, EXIT_INTERNAL, EXIT_TIMEOUT, EXIT_WORKDIR_QUOTA, INSIDE_WORKDIR,
                                     KILL_GRACE_S, OUTPUT_CAP_BYTES, OUTPUT_DRAIN_S,
                                     SIGNALLED_GRACE_S, RunnerError, TaskIdentity, check_interval,
                                     check_limits, effective_limits, read_task, size_text)
from execution.runner.outputs import Capture, copy_outputs, write_usage_file
from execution.runner.sandbox_start import agent_status
from execution.runner.signals import Interrupted, Signals
from execution.runner.task import (choose_runtime, load_spec_policy, make_private_dir, read_input, read_spec,
                                   registered_hosts, sandbox_paths, write_input)
from execution.runner.teardown import file_too_large, out_of_memory
from execution.runner.teardown import WorkdirWatch, remove_tree, terminate_group, tree_bytes
from execution.runner.workdir_tmpfs import MAX_KEPT_ENTRIES, keep_tree, usage, view_path, workdir_mode
from execution.spool.contract import STAGES
from execution.spool.record import RunnerRecord


def say(text: str) -> None:
    """One line on the runner's stderr (Grid Engine's error file of the job, in the spool): never
    raises, so a full or unwritable spool cannot change the runner's exit status."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Runner:
    """One task's run. ``environ`` is the process environment (a mapping); ``clock`` the stage
    clock (default: anchored when execution/runner/clock.py was imported); ``kill_grace_s``
    (seconds; the spec's ``kill_grace_s`` overrides it) and ``output_cap`` (bytes per output
    pipe). :meth:`run` does it all and returns the exit status."""

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
        self.signals = Signals()
        self.exit_code = EXIT_INTERNAL
        self.task: TaskIdentity | None = None
        self.work_dir: str | None = None
        self.private_dir: str | None = None
        self.sandbox = None
        self.sandbox_info: dict | None = None
        self.captures: list[Capture] = []
        self.outputs: list[dict] = []
        self.usage: dict | None = None
        self.proxy = None  # execution.runner.proxy_start.ProxyStarter (bubblewrap runtime)
        self.network = None  # execution.runner.network.LiveNetworkPolicy (bubblewrap runtime)
        self._workdir_watch: WorkdirWatch | None = None
        self.limits: dict[str, int] = {}
        self.memory_group = None  # execution.runner.memory_cgroup.TaskMemoryGroup (bubblewrap runtime)
        #: Under bubblewrap with TCO_SANDBOX_WORKDIR=tmpfs (the default): /sandbox is a tmpfs of the
        #: disk limit's size (execution/runner/workdir_tmpfs.py); its descriptor once the sandbox is built.
        self.work_tmpfs = False
        self.work_fd: int | None = None
        self.tracer = None  # execution.metering.otel.TaskTracer when OTEL_EXPORTER_OTLP_* asks for traces
        self.telemetry: dict | None = None

    # ---- setup
    def _read_environment(self) -> None:
        self.task = read_task(self.environ)
        if self.task.defaulted:
            self.flags.append("task_number_defaulted")
        os.makedirs(self.task.record_dir, mode=0o700, exist_ok=True)
        check_limits(self.environ)
        workdir_mode(self.environ)
        self._seccomp_mode()
        self._start_tracing()

    def _seccomp_mode(self) -> str:
        """``TCO_SANDBOX_SECCOMP`` (execution/sandbox/seccomp.py ``seccomp_mode``). Raises RunnerError."""
        from execution.sandbox.seccomp import seccomp_mode

        try:
            return seccomp_mode(self.environ)
        except ValueError as exc:
            raise RunnerError(str(exc)) from None

    def _seccomp_program(self) -> bytes | None:
        """The sandbox's seccomp filter (BPF), None when the site turned it off; notes which in
        ``sandbox.seccomp``. Raises RunnerError when it cannot be built (no libseccomp binding on
        this host): the sandbox never starts unfiltered by accident."""
        from execution.sandbox.seccomp import SeccompUnavailable, description, program_bytes

        mode = self._seccomp_mode()
        self.sandbox_info["seccomp"] = description(mode)
        if mode == "off":
            return None
        try:
            return program_bytes()
        except (SeccompUnavailable, RuntimeError, OSError) as exc:
            raise RunnerError(f"the sandbox's seccomp filter cannot be built: {exc}") from None

    def _start_tracing(self) -> None:
        """With an OTLP endpoint set (docs/otel.md), set up the task's traces in a thread of their own,
        beside the sandbox's start (importing OpenTelemetry takes tens of milliseconds)."""
        from execution.metering.otel import TaskTracer, tracing_configured

        if not tracing_configured(self.environ):
            return
        task = self.task
        self.tracer = TaskTracer(self.environ, campaign_id=task.campaign_id, task_number=task.task_number,
                                 job_number=task.job_number)
        threading.Thread(target=self.tracer.start, args=(self.stages["task_started_at"],), name="tco-otel-start",
                         daemon=True).start()

    def _finish_tracing(self, spec: dict | None) -> None:
        """End the task's trace after the teardown (bounded wait, shorter after a signal: the record
        must be out within Grid Engine's notify time) and keep its counts for the record."""
        if self.tracer is None:
            return
        flush_s = self.tracer.flush_s if self.signals.runner_signal is None else min(self.tracer.flush_s, 0.5)
        self.telemetry = self.tracer.finish(self.stages, model=(spec or {}).get("model"), exit_code=self.exit_code,
                                            flags=self.flags, flush_s=flush_s)

    def _read_spec(self) -> dict:
        spec, kill_grace_s = read_spec(self.task)
        if kill_grace_s is not None:
            self.kill_grace_s = kill_grace_s
        return spec

    def _setup_proxy(self, spec: dict, policy) -> None:
        """Work out the proxy's plan (it is started later, when the agent wants it) and follow the
        campaign's network policy file (docs/runner.md)."""
        from execution.runner.network import LiveNetworkPolicy, network_ceilings
        from execution.runner.proxy_start import ProxyStarter, plan_proxy

        plan = plan_proxy(spec, policy, self.environ, self.task, self.sandbox_info["notes"])
        self.proxy = ProxyStarter(plan, socket_path=os.path.join(self.private_dir, "sock", "proxy.sock"),
                                  requests_path=self.task.task_file("requests.jsonl"), tracer=self.tracer,
                                  started_at=self.stages["task_started_at"])
        ceilings = network_ceilings(spec, policy)
        self.sandbox_info["network_policy"] = {"version": 0, "changes": []}
        self.network = LiveNetworkPolicy(base=policy, ceilings=ceilings, proxy=self.proxy, clock=self.clock,
                                         info=self.sandbox_info["network_policy"], campaign_id=self.task.campaign_id,
                                         path=self.task.layout.network_policy_path(self.task.campaign_id))
        self.network.start()

    def _start_proxy_soon(self) -> None:
        if self.proxy is not None:
            self.proxy.start_soon()

    # ---- the agent
    def _start_agent(self, spec: dict) -> None:
        from execution.runner.sandbox_start import AgentStart
        from execution.sandbox import SandboxStartError
        from execution.sandbox.checks import refusals

        task = self.task
        policy = load_spec_policy(spec)
        runtime = choose_runtime(self.environ, spec, policy)
        paths = sandbox_paths(self.environ, task.spool)
        # The launch form calls the same function: a policy refused here is refused there.
        refused = refusals(policy, masked_paths=paths["masked"], state_paths=paths["state"],
                           shared_paths=paths["shared"], runtime=runtime, registered=registered_hosts(spec))
        if refused:
            raise RunnerError("the runner refuses this sandbox policy: " + "; ".join(refused))
        findings = policy.unenforceable() if runtime == "bubblewrap" else []
        self.limits = effective_limits(self.environ, spec)
        self.sandbox_info = {"runtime": runtime, "policy_sha256": policy.sha256, "uid": policy.uid,
                             "gid": policy.gid, "notes": [str(f) for f in findings], "log": "",
                             "limits": {key: self.limits[name] for key, name in SPEC_LIMITS.items()}}

        self.work_dir = task.layout.work_dir(task.campaign_id, task.task_number)
        os.makedirs(self.work_dir, mode=0o700, exist_ok=True)
        write_input(self.work_dir, read_input(spec["inputs_file"], task.task_number) + "\n")
        argv = [a.replace("{input}", f"{INSIDE_WORKDIR}/input.json").replace("{workdir}", INSIDE_WORKDIR)
                for a in spec["agent"]["command"]]
        self.private_dir = make_private_dir(self.environ)

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        start = AgentStart(policy=policy, argv=argv, work_dir=self.work_dir, private_dir=self.private_dir,
                           out_w=out_w, err_w=err_w)
        try:
            if runtime == "openshell":
                self.flags.append("unmetered_runtime")
                self._start_openshell(spec, start)
            else:
                self._start_bwrap(spec, start)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        # Output files appear once the agent runs (stdout_path is null if it never did); the
        # pipes hold what it writes meanwhile.
        try:
            self.signals.arm()
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
            self.signals.armed = False
        self.work_fd = getattr(self.sandbox, "work_fd", None)
        for fd, suffix in ((out_r, "stdout"), (err_r, "stderr")):
            capture = Capture(fd, task.task_file(suffix), self.output_cap)
            capture.start()
            self.captures.append(capture)
        self._note_stages()

    def _start_bwrap(self, spec: dict, start) -> None:
        from execution.runner.sandbox_start import prepare_bwrap
        from execution.runner.task import agent_env
        from execution.sandbox.plan import RELAY_PORT

        seccomp = self._seccomp_program()
        self._setup_proxy(spec, start.policy)
        self.work_tmpfs = workdir_mode(self.environ) == "tmpfs"
        self.sandbox_info["workdir"] = "tmpfs" if self.work_tmpfs else "spool"
        launch = prepare_bwrap(start, env=agent_env(self.environ, spec, self.task, RELAY_PORT),
                               paths=sandbox_paths(self.environ, self.task.spool, self.private_dir),
                               limits=self.limits,
                               on_proxy_wanted=self._start_proxy_soon, work_tmpfs=self.work_tmpfs,
                               seccomp=seccomp)
        self.sandbox = launch.sandbox
        self.sandbox_info["notes"] += launch.notes
        self._enter_memory_group(launch.sandbox)
        self.signals.armed = False  # never interrupt between fork and bookkeeping
        launch.start()
        self.stages["sandbox_create_at"] = self.clock.iso_mono(self.sandbox.mono.get("create"))

    def _enter_memory_group(self, sandbox) -> None:
        """Start ``sandbox`` inside the task's memory cgroup (execution/runner/memory_cgroup.py), or
        note why there is none."""
        from execution.runner.memory_cgroup import make_group

        task = self.task
        name = f"{task.campaign_id}.{task.task_number}.{task.job_number or 0}.{os.getpid()}"
        # A tmpfs work directory's pages are memory charged to this group: room for both limits.
        limit = self.limits["TCO_SANDBOX_MEMORY_BYTES"] + (self.limits["TCO_SANDBOX_WORK_BYTES"] if self.work_tmpfs
                                                           else 0)
        group, note = make_group(self.environ, name, limit)
        if group is None:
            self.sandbox_info["notes"].append(note)
            return
        self.memory_group = group
        sandbox.launch_prefix = group.prefix(sys.executable)

    def _start_openshell(self, spec: dict, start) -> None:
        from execution.runner.sandbox_start import openshell_sandbox
        from execution.sandbox import SandboxStartError

        self.sandbox = openshell_sandbox(start, spec=spec, environ=self.environ, task=self.task)
        self.signals.armed = True
        try:
            self.sandbox.start()
        except SandboxStartError as exc:
            raise RunnerError(str(exc)) from exc
        finally:
            self.signals.armed = False
        self.stages["sandbox_create_at"] = self.clock.iso_mono(self.sandbox.mono.get("create"))

    def _note_stages(self) -> None:
        mono = self.sandbox.mono
        self.stages["sandbox_create_at"] = self.clock.iso_mono(mono.get("create"))
        self.stages["sandbox_ready_at"] = self.clock.iso_mono(mono.get("ready"))
        self.stages["agent_started_at"] = self.clock.iso_mono(mono.get("started"))

    def _wait_agent(self, timeout_s: float | None) -> None:
        if timeout_s:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        if self.work_dir is not None:
            fd = self.work_fd
            # A tmpfs: the kernel already refuses writes past its size; a full one ends the task as
            # the walk's limit does (the agent's writes fail from then on).
            full = (lambda: usage(fd)[1]) if fd is not None else None
            self._workdir_watch = WorkdirWatch(self.work_dir, self.limits["TCO_SANDBOX_WORK_BYTES"],
                                               check_interval(self.environ), self.signals.over_quota, is_over=full)
            self._workdir_watch.start()
        self.signals.arm()
        self.sandbox.wait_exit()
        self.signals.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._set_agent_status()
        self.stages["agent_exited_at"] = self.clock.iso_mono(self.sandbox.mono.get("exited")) \
            or self.clock.iso()

    def _set_agent_status(self) -> None:
        status = agent_status(self.sandbox)
        if status is not None:
            self.agent_signal, self.exit_status = status

    def _flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    # ---- the whole run
    def run(self) -> int:
        """Run the task; always try to write a record. Returns the runner's exit status
        (docs/runner.md, "Exit status and flags")."""
        self.signals.install()
        spec = None
        try:
            if os.getpgrp() != os.getpid():
                os.setpgid(0, 0)
            self.signals.arm()
            self._read_environment()
            spec = self._read_spec()
            self.signals.armed = False
            self._start_agent(spec)
            self._wait_agent(spec.get("timeout_s"))
        except RunnerError as exc:
            self.error, self.exit_code = str(exc), EXIT_CONFIG
            self.flags.append("runner_error")
        except Interrupted:
            pass
        except Exception as exc:  # noqa: BLE001 - a runner bug must still leave a record
            self.error, self.exit_code = f"internal error: {exc!r}", EXIT_INTERNAL
            self.flags.append("runner_error")
        finally:
            self.signals.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
        self._teardown(spec)
        self._finish_tracing(spec)
        return self._write_record()

    def _teardown(self, spec: dict | None) -> None:
        """Stop the sandbox, the group, the watches and the proxy; copy outputs; set the flags,
        ``teardown_done_at`` and the exit code."""
        self.signals.armed = False
        if self.sandbox is not None:
            # After a signal the scheduler's SIGKILL may follow soon: the record must be out first.
            grace = min(self.kill_grace_s, SIGNALLED_GRACE_S) if self.signals.runner_signal is not None \
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
        self._leave_memory_group()
        try:
            terminate_group(self.kill_grace_s)
        except Exception as exc:  # noqa: BLE001
            self._flag("runner_error")
            self.error = self.error or f"teardown failed: {exc!r}"
        if self._workdir_watch is not None:
            self._workdir_watch.done.set()
        if self.network is not None:
            self.network.stop()
        if self.work_fd is not None:
            self._measure_tmpfs()
        elif self.work_dir is not None and self.stages["agent_started_at"] is not None:
            try:
                work_bytes = tree_bytes(self.work_dir)
                if self.sandbox_info is not None:
                    self.sandbox_info["work_bytes"] = work_bytes
                if work_bytes > self.limits["TCO_SANDBOX_WORK_BYTES"]:
                    self.signals.workdir_over = True
            except RunnerError:
                pass
        if self.signals.workdir_over:
            self._flag("workdir_over_quota")
        self._note_limit_reached()
        for capture in self.captures:
            capture.join(OUTPUT_DRAIN_S)
            if capture.is_alive():
                self.flags.append("output_incomplete")
                break
        self._stop_proxy()
        if spec is not None and self.work_dir is not None and self.stages["agent_started_at"] is not None:
            try:
                source = view_path(self.work_fd) if self.work_fd is not None else self.work_dir
                skipped = copy_outputs(spec["agent"].get("outputs") or [], work_dir=source, into=self.outputs,
                                       target_dir=self.task.layout.outputs_dir(self.task.campaign_id,
                                                                               self.task.task_number))
                if skipped:
                    self._flag("outputs_skipped")
            except OSError as exc:
                self._flag("outputs_skipped")
                self.error = self.error or f"could not copy outputs: {exc}"
        self._keep_tmpfs()
        if self.private_dir is not None:
            remove_tree(self.private_dir)
        if self.signals.timed_out and self.stages["agent_exited_at"] is None:
            self.flags.append("agent_timeout")
        if self.signals.runner_signal is not None:
            self.flags.append("runner_signalled")
        self.stages["teardown_done_at"] = self.clock.iso()

        if "runner_error" not in self.flags:
            if self.stages["agent_exited_at"] is not None:  # ended by itself: its status
                self.exit_code = self.exit_status if self.agent_signal is None else 128 + self.agent_signal
            elif self.signals.runner_signal is not None:
                self.exit_code = 128 + self.signals.runner_signal
            elif self.signals.workdir_over:
                self.exit_code = EXIT_WORKDIR_QUOTA
            elif self.signals.timed_out:
                self.exit_code = EXIT_TIMEOUT
        if self.exit_code in (99, 100):  # Grid Engine: reschedule / error state
            self.exit_code = 101

    def _measure_tmpfs(self) -> None:
        """The tmpfs work directory after the agent: ``sandbox.work_bytes`` (in use) and whether the
        agent ran into its size: full, and the agent stopped by the watch or ended by itself with a
        failure (the kernel's ENOSPC; an agent that exits 0 with its disk exactly full is not
        failed for it)."""
        try:
            used, full = usage(self.work_fd)
        except OSError:
            return
        if self.sandbox_info is not None:
            self.sandbox_info["work_bytes"] = used
        failed = self.agent_signal is not None or self.exit_status not in (None, 0)
        if full and failed:
            self.signals.workdir_over = True

    def _keep_tmpfs(self) -> None:
        """Copy the tree the agent left in its tmpfs to the spool's work directory (where the task page
        lists it; execution/runner/workdir_tmpfs.py ``keep_tree``), note what was skipped, and
        close the tmpfs. Not after a signal to the runner: the scheduler's SIGKILL follows soon and
        the record comes first (the declared outputs are copied already)."""
        fd, self.work_fd = self.work_fd, None
        try:
            if fd is None:
                return
            if self.signals.runner_signal is not None:
                if self.sandbox_info is not None:
                    self.sandbox_info["notes"].append("the work directory was not kept: the runner was signalled")
                return
            try:
                kept = keep_tree(view_path(fd), self.work_dir, max_bytes=self.limits["TCO_SANDBOX_WORK_BYTES"])
            except OSError as exc:
                self._flag("outputs_skipped")
                self.error = self.error or f"could not keep the work directory: {exc}"
                return
            if self.sandbox_info is not None:
                self.sandbox_info["work_kept"] = kept
                if kept["skipped"]:
                    self.sandbox_info["notes"].append(
                        f"the work directory: {kept['skipped']} entries not kept (links, devices, unreadable, "
                        f"a second hard link, past {MAX_KEPT_ENTRIES} files or past the work directory "
                        f"limit of {self.limits['TCO_SANDBOX_WORK_BYTES']} bytes)")
        finally:
            if self.sandbox is not None and hasattr(self.sandbox, "close_workdir"):
                self.sandbox.close_workdir()  # the descriptor is the sandbox's; the tmpfs goes with it

    def _leave_memory_group(self) -> None:
        """Note the task's memory cgroup in the record (``sandbox.memory_cgroup``: limit, peak, OOM
        kills) and remove it, killing anything of the sandbox still in it."""
        group, self.memory_group = self.memory_group, None
        if group is None:
            return
        try:
            if self.sandbox_info is not None:
                self.sandbox_info["memory_cgroup"] = group.report()
        except (OSError, ValueError) as exc:
            if self.sandbox_info is not None:
                self.sandbox_info["notes"].append(f"the task's memory cgroup could not be read: {exc}")
        group.remove()

    def _note_limit_reached(self) -> None:
        """Flag the limit the agent ran into and say so in ``error`` (docs/limits.md): the work
        directory (the runner's walk), the task's memory cgroup (the kernel's OOM killer killed one of
        its processes), a file's size (SIGXFSZ, or EFBIG reported on stderr), CPU time (SIGXCPU) or
        memory (the agent failed on an allocation)."""
        if not self.limits or self.signals.runner_signal is not None:
            return
        reason = None
        group = (self.sandbox_info or {}).get("memory_cgroup") or {}
        if self.signals.workdir_over:
            reason = f"work directory limit {size_text(self.limits['TCO_SANDBOX_WORK_BYTES'])} reached"
        elif group.get("oom_kills"):
            self._flag("memory_limit")
            held = (f" with the files of its work directory, held in memory: {size_text(group['limit_bytes'])} in all"
                    if self.work_tmpfs and group.get("limit_bytes") else "")
            reason = (f"memory limit {size_text(self.limits['TCO_SANDBOX_MEMORY_BYTES'])} reached (the task's "
                      f"processes together{held}; the kernel killed {group['oom_kills']} of them)")
        elif self.agent_signal == signal.SIGXFSZ or (self.exit_status not in (None, 0) and len(self.captures) > 1
                                                     and file_too_large(self.captures[1].path)):
            self._flag("file_size_limit")
            reason = f"file size limit {size_text(self.limits['TCO_SANDBOX_FILE_BYTES'])} reached"
        elif self.agent_signal == signal.SIGXCPU:
            self._flag("cpu_limit")
            reason = f"CPU time limit {self.limits['TCO_SANDBOX_CPU_S']} s reached"
        elif self.exit_status not in (None, 0) and len(self.captures) > 1 and \
                out_of_memory(self.captures[1].path):
            self._flag("memory_limit")
            reason = f"memory limit {size_text(self.limits['TCO_SANDBOX_MEMORY_BYTES'])} reached"
        if reason is not None:
            self.error = self.error or reason

    def _stop_proxy(self) -> None:
        if self.proxy is None or not self.proxy.started:
            return
        self.usage = self.proxy.stop()
        if self.proxy.error:
            self._flag("proxy_error")
            self.error = self.error or self.proxy.error

    def _write_usage_file(self) -> str | None:
        """``<task>.usage`` for flexible accounting (execution/runner/outputs.py); its path, or None
        without totals or when it cannot be written (flagged ``usage_file_error``)."""
        if not self.usage or self.task is None:
            return None
        path = self.task.task_file("usage")
        try:
            write_usage_file(path, self.usage)
        except (OSError, ValueError) as exc:
            self._flag("usage_file_error")
            say(f"tco runner: usage file not written: {exc}")
            return None
        return path

    def _write_record(self) -> int:
        """Write the runner record (docs/runner.md); the runner's exit status."""
        if self.task is None:
            say(f"tco runner: {self.error}; no record written")
            return self.exit_code
        task = self.task
        usage_file = self._write_usage_file()
        proxy_started = self.proxy is not None and self.proxy.started
        record = RunnerRecord(
            campaign_id=task.campaign_id,
            task_number=task.task_number,
            job_number=task.job_number,
            hostname=os.uname().nodename,
            stages=self.stages,
            exit_status=self.exit_status,
            signal=self.agent_signal,
            stdout_path=task.task_file("stdout") if self.captures else None,
            stderr_path=task.task_file("stderr") if self.captures else None,
            stdout_truncated=bool(self.captures and self.captures[0].truncated),
            stderr_truncated=bool(len(self.captures) > 1 and self.captures[1].truncated),
            outputs=self.outputs,
            sandbox=self.sandbox_info,
            usage=self.usage,
            requests_path=self.proxy.requests_file if proxy_started else None,
            usage_file=usage_file,
            flags=self.flags,
            runner_signal=self.signals.runner_signal,
            error=self.error,
            extra={"telemetry": self.telemetry} if self.telemetry is not None else {},
        )
        try:
            record.write(task.layout.record_path(task.campaign_id, task.task_number))
        except OSError as exc:
            say(f"tco runner: cannot write record: {exc}")
            return EXIT_INTERNAL
        if self.error:
            say(f"tco runner: {self.error}")
        return self.exit_code


def main() -> int:
    """Entry point: run the task described by the environment; return the exit status.

    The umask is 077 first: what the runner, its proxy and its agent write in the
    spool (records, logs, request records, work directory, outputs) is the submit
    account's alone (files 0600, directories 0700), whatever umask Grid Engine gave."""
    os.umask(0o077)
    return Runner(os.environ).run()
