"""The signals that end a run early: a signal to the runner, its timeout, a full work directory.

See docs/runner.md ("Processes and signals"). A handler interrupts a blocking
wait only while the run is *armed* (waiting for the sandbox); elsewhere it only
notes the signal, and the next :meth:`Signals.arm` raises at once.
"""
from __future__ import annotations

import os
import signal

from execution.runner.config import TERMINATING_SIGNALS


class Interrupted(BaseException):
    """Raised from a signal handler to leave a blocking wait. BaseException so
    that no ``except Exception`` on the way swallows it."""


class Signals:
    """What ended (or will end) the run: :attr:`runner_signal` (the first of
    :data:`~execution.runner.config.TERMINATING_SIGNALS`), :attr:`timed_out` (SIGALRM from the
    timeout), :attr:`workdir_over` (the work directory watch); :attr:`armed` while a wait may be
    interrupted."""

    def __init__(self) -> None:
        self.runner_signal: int | None = None
        self.timed_out = False
        self.workdir_over = False
        self.armed = False

    def install(self) -> None:
        """Handle the terminating signals and SIGALRM in this process."""
        for sig in TERMINATING_SIGNALS + (signal.SIGALRM,):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGALRM:
            if not self.workdir_over:  # the work directory watch sends SIGALRM too
                self.timed_out = True
        elif self.runner_signal is None:
            self.runner_signal = signum
        if self.armed:
            self.armed = False
            raise Interrupted()

    def arm(self) -> None:
        """Let a signal interrupt what follows; raises Interrupted at once if one arrived while
        disarmed."""
        self.armed = True
        if self.runner_signal is not None or self.timed_out or self.workdir_over:  # arrived while disarmed
            self.armed = False
            raise Interrupted()

    def over_quota(self) -> None:
        """From the work directory watch: stop the agent as a timeout would."""
        self.workdir_over = True
        os.kill(os.getpid(), signal.SIGALRM)
