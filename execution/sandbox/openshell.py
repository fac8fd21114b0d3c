"""The OpenShell runtime: the same policy handed to OpenShell through its documented CLI.

Used by the runner where ``openshell`` is on PATH and the policy names no
loopback endpoint (OpenShell refuses those). OpenShell cannot run on tco's
dev machine, so this driver is tested against a stand-in ``openshell`` that
records its arguments (tests/host/sandbox/test_openshell_driver.py); the commands
and flags are those of OpenShell's CLI reference:

1. ``openshell sandbox create --name N --policy FILE --detach --no-tty
   --no-auto-providers [--provider P ...]``: the sandbox with the policy
   (filesystem, Landlock and process take effect at creation). ``P`` are the
   providers the policy's ``credential_binding`` entries name: under OpenShell
   credentials live in the gateway as providers the admin created once
   (``openshell provider create --name anthropic --type anthropic
   --credential ANTHROPIC_API_KEY``); tco never handles the secret.
2. ``openshell sandbox upload N <work>/input.json /sandbox``: the task input
   (``--upload`` cannot be combined with a main command, so it is a step).
   ``sandbox_ready_at`` is taken here.
3. ``openshell sandbox exec --name N --workdir /sandbox --no-tty --env K=V ...
   -- ARGV``: the agent; its stdout/stderr and exit status are the command's.
4. ``openshell sandbox download N /sandbox <work>``: the work directory back
   (declared outputs are then copied by the runner as with bubblewrap).
5. ``openshell sandbox delete N``: always, also after a failure or a signal.

OpenShell's own proxy carries the agent's traffic, so tco does not meter it
(the runner flags ``unmetered_runtime``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

from execution.sandbox import SandboxStartError
from execution.sandbox.bwrap import which
from execution.sandbox.policy.model import Policy

__all__ = ["SandboxStartError", "OpenShellSandbox"]

CLI_TIMEOUT_S = 600.0


class OpenShellSandbox:
    """One agent in one OpenShell sandbox, driven through the ``openshell`` CLI.

    Same interface as :class:`execution.sandbox.bwrap.BwrapSandbox`: :meth:`start`,
    :meth:`wait_ready`, :meth:`wait_exit`, :meth:`stop`, :meth:`log`, and
    :attr:`mono`, :attr:`exit`, :attr:`killed`, :attr:`proc`.
    """

    def __init__(self, *, policy: Policy, name: str, workdir: str, agent_argv: list[str], env: dict[str, str],
                 stdout_fd: int, stderr_fd: int, private_dir: str, cli: str = "openshell") -> None:
        self.policy = policy
        self.name = name
        self.workdir = workdir
        self.agent_argv = agent_argv
        self.env = env
        self.stdout_fd = os.dup(stdout_fd)
        self.stderr_fd = os.dup(stderr_fd)
        self.private_dir = private_dir
        self.cli = which(cli) or cli
        self.mono: dict[str, int] = {}
        self.exit: tuple[str, int] | None = None
        self.killed = False
        self.proc: subprocess.Popen | None = None
        self.created = False
        self._log: list[str] = []
        self._step: subprocess.Popen | None = None

    def _cli_env(self) -> dict[str, str]:
        # The CLI's own configuration only: never the runner's credentials file or spool.
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "HOME", "LANG", "LC_ALL") or k.startswith(("XDG_", "OPENSHELL_"))}
        env.update(NO_COLOR="1", OPENSHELL_COLOR="never")
        return env

    def _run(self, *args: str, check: bool = True) -> str:
        argv = [self.cli, *args]
        self._step = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=self._cli_env())
        try:
            out, _ = self._step.communicate(timeout=CLI_TIMEOUT_S)
        except BaseException:
            self._step.kill()
            self._step.wait()
            raise
        finally:
            step, self._step = self._step, None
        text = out.decode("utf-8", "replace").strip()
        if text:
            self._log.append(f"$ openshell {' '.join(args)}\n{text[-4000:]}")
        if check and step.returncode != 0:
            raise SandboxStartError(f"openshell {args[0]} {args[1]} failed (exit {step.returncode})"
                                    + (f": {text[-1000:]}" if text else ""))
        return text

    def start(self) -> None:
        """Create the sandbox with the policy, upload the input and start the agent in it.
        Raises SandboxStartError (the CLI failed or cannot run)."""
        policy_file = os.path.join(self.private_dir, "policy.yaml")
        with open(policy_file, "w", encoding="utf-8") as fh:
            fh.write(self.policy.to_yaml())
        providers = sorted({e.credential_provider for _, e in self.policy.endpoints() if e.credential_provider})
        create = ["sandbox", "create", "--name", self.name, "--policy", policy_file, "--detach", "--no-tty",
                  "--no-auto-providers"]
        for provider in providers:
            create += ["--provider", provider]
        self.mono["create"] = time.monotonic_ns()
        self.created = True  # from here on, always try to delete it
        self._run(*create)
        self._run("sandbox", "upload", self.name, os.path.join(self.workdir, "input.json"), "/sandbox")
        self.mono["ready"] = time.monotonic_ns()
        argv = [self.cli, "sandbox", "exec", "--name", self.name, "--workdir", "/sandbox", "--no-tty"]
        for key, value in sorted(self.env.items()):
            argv += ["--env", f"{key}={value}"]
        argv += ["--", *self.agent_argv]
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.stdout_fd,
                                         stderr=self.stderr_fd, env=self._cli_env())
        except OSError as exc:
            raise SandboxStartError(f"cannot run openshell: {exc.strerror or exc}") from exc
        finally:
            os.close(self.stdout_fd)
            os.close(self.stderr_fd)
            self.stdout_fd = self.stderr_fd = -1
        self.mono["started"] = time.monotonic_ns()

    def wait_ready(self) -> None:
        """The agent runs once :meth:`start` returned; raises SandboxStartError if it was not started."""
        if self.proc is None:
            raise SandboxStartError("the OpenShell sandbox was not started")

    def wait_exit(self) -> None:
        """Block until the agent's ``openshell sandbox exec`` ends; note its exit."""
        code = self.proc.wait()
        self.mono["exited"] = time.monotonic_ns()
        self.exit = ("signal", -code) if code < 0 else ("code", code)

    def stop(self, grace_s: float) -> None:
        """Stop the agent (SIGTERM, SIGKILL after ``grace_s`` seconds), download the work directory
        and delete the sandbox. Never raises for a failed download or delete (logged)."""
        for fd in (self.stdout_fd, self.stderr_fd):
            if fd >= 0:
                os.close(fd)
        self.stdout_fd = self.stderr_fd = -1
        if self._step is not None and self._step.poll() is None:
            self._step.kill()
            self._step.wait()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait()
        if not self.created:
            return
        if self.proc is not None:
            try:
                self._run("sandbox", "download", self.name, "/sandbox", self.workdir, check=False)
            except (OSError, subprocess.SubprocessError) as exc:
                self._log.append(f"download failed: {exc}")
        try:
            self._run("sandbox", "delete", self.name, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            self._log.append(f"delete failed: {exc}")
        self.created = False

    def log(self) -> str:
        """What the OpenShell CLI said (its failures and this driver's notes), one per line."""
        return "\n".join(self._log)
