"""The relay: PID 1 of a bubblewrap sandbox, between the agent and the metering proxy.

Run by the runner through bubblewrap (``--as-pid-1``), standard library only,
with ``python3 -I -S``::

    relay.py --status-fd N --stdout-fd O --stderr-fd E --port P
             --socket /run/tco/proxy.sock [--watch-fd M] [--proxy-wait-s S]
             [--max-processes N] [--memory-bytes B] [--file-bytes F] [--cpu-s S]
             [--hold-fd H] -- AGENT ARGV...

0. With ``--max-processes``, sets RLIMIT_NPROC (setrlimit(2)) to N before
   anything else starts: the kernel counts the processes and threads of the
   sandbox's uid in the sandbox's own user namespace (Linux >= 5.14
   ucounts), so a fork bomb stops at N while the relay's threads (started
   before the agent) keep working. ``--memory-bytes`` sets RLIMIT_DATA (an
   allocation past it fails with ENOMEM), ``--file-bytes`` RLIMIT_FSIZE (a
   write past it: SIGXFSZ), ``--cpu-s`` RLIMIT_CPU (SIGXCPU at S seconds of
   CPU, SIGKILL at S+5); every process of the sandbox inherits them.

1. Listens on ``127.0.0.1:P``, the sandbox's own loopback (its network
   namespace has nothing else), so the agent sees an ordinary HTTP base URL.
2. Writes ``ready <monotonic ns>`` to the status pipe: the sandbox is ready
   to run the agent (``sandbox_ready_at``). With ``--hold-fd``, waits for one
   byte on it: the runner opens the sandbox's tmpfs work directory meanwhile
   (execution/sandbox/bwrap.py), so it holds it even if the agent ends at once;
   without that byte (the pipe closed) it ends without starting the agent
   (``spawn-error 0 ...``, exit 125).
3. Starts the agent (``posix_spawnp``: it returns once the exec is done),
   its stdout and stderr on ``--stdout-fd``/``--stderr-fd`` (the relay's own
   stderr is the sandbox log), and
   writes ``started <monotonic ns>`` (``agent_started_at``), or
   ``spawn-error <errno> <text>`` and exits 127.
4. Passes each connection to the Unix socket ``--socket`` (bound into the
   sandbox; the proxy listens on it outside). On the first connection it
   writes ``proxy <monotonic ns>``: the runner starts the proxy only when an
   agent uses it, and the relay retries connecting for ``--proxy-wait-s``.
5. Reaps every process (it is PID 1), and when the agent has exited writes
   ``exited code N <ns>`` or ``exited signal N <ns>`` and exits with the
   agent's status (128+N for a signal). Its exit ends the PID namespace, so
   the kernel kills whatever the agent left behind.

Signals: SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU and SIGQUIT sent
to the relay from outside are passed to every other process of the sandbox
(``kill(-1)``). Suspension: bubblewrap puts the sandbox in a new session,
out of the job's process group that Grid Engine stops with SIGSTOP; with
``--watch-fd`` (an fd open on the runner's ``/proc/PID/stat``) the relay
stops the sandbox's processes while the runner is stopped and continues them
with it.

Times are CLOCK_MONOTONIC, the same clock as the runner's outside (bubblewrap
does not make a time namespace); the runner turns them into UTC.
"""
import os
import signal
import socket
import sys
import threading
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU,
             signal.SIGQUIT)
DEFAULTED = FORWARDED + (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTSTP, signal.SIGTTIN,
                         signal.SIGTTOU, signal.SIGALRM)
BUFFER = 65536
WATCH_INTERVAL_S = 0.1

_lock = threading.Lock()
_status_fd = -1
_agent_pid = 0
_pending = []
_first_connection = threading.Event()


def report(*words) -> None:
    """Write one status line (the words, space-separated) to the runner's status pipe; never raises."""
    line = (" ".join(str(w) for w in words) + "\n").encode("utf-8", "replace")
    with _lock:
        try:
            os.write(_status_fd, line)
        except OSError:
            pass  # the runner is gone; the agent still runs to its end


def _on_signal(signum, _frame) -> None:
    if _agent_pid:
        try:
            os.kill(-1, signum)
        except OSError:
            pass
    else:
        _pending.append(signum)


def _connect(path: str, deadline: float):
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        except OSError:
            sock.close()
            return None


def _copy(src, dst) -> None:
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _serve(client, path: str, wait_s: float) -> None:
    upstream = _connect(path, time.monotonic() + wait_s)
    if upstream is None:
        client.close()
        return
    back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
    try:
        back.start()
    except RuntimeError:  # the process limit is reached
        client.close()
        upstream.close()
        return
    _copy(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept(listener, path: str, wait_s: float) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        if not _first_connection.is_set():
            _first_connection.set()
            report("proxy", time.monotonic_ns())
        try:
            threading.Thread(target=_serve, args=(client, path, wait_s), daemon=True).start()
        except RuntimeError:  # no thread left under the process limit: this connection only fails
            client.close()


def _watch(fd: int) -> None:
    stopped = False
    while True:
        time.sleep(WATCH_INTERVAL_S)
        try:
            stat = os.pread(fd, 1024, 0)
        except OSError:
            return  # the runner is gone
        if not stat:
            return
        runner_stopped = stat[stat.rindex(b")") + 2:][:1] == b"T"
        if runner_stopped != stopped:
            try:
                os.kill(-1, signal.SIGSTOP if runner_stopped else signal.SIGCONT)
            except OSError:
                pass
            stopped = runner_stopped


def _set_limits(opts):
    """RLIMIT_DATA, RLIMIT_FSIZE and RLIMIT_CPU from the options (module doc, step 0)."""
    import resource

    for option, which, extra in (("--memory-bytes", resource.RLIMIT_DATA, 0),
                                 ("--file-bytes", resource.RLIMIT_FSIZE, 0),
                                 ("--cpu-s", resource.RLIMIT_CPU, CPU_KILL_AFTER_S)):
        if opts[option] is not None:
            value = int(opts[option])
            resource.setrlimit(which, (value, value + extra))


def _parse(argv):
    opts = {"--watch-fd": None, "--proxy-wait-s": "30", "--max-processes": None, "--memory-bytes": None,
            "--file-bytes": None, "--cpu-s": None, "--hold-fd": None}
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] not in ("--status-fd", "--stdout-fd", "--stderr-fd", "--port", "--socket", "--watch-fd",
                           "--proxy-wait-s", "--max-processes", "--memory-bytes", "--file-bytes", "--cpu-s",
                           "--hold-fd") \
                or i + 1 >= len(argv):
            raise SystemExit(f"relay: bad argument {argv[i]!r}")
        opts[argv[i]] = argv[i + 1]
        i += 2
    agent = argv[i + 1:]
    if not agent or any(name not in opts for name in ("--status-fd", "--stdout-fd", "--stderr-fd", "--port",
                                                      "--socket")):
        raise SystemExit("usage: relay.py --status-fd N --stdout-fd O --stderr-fd E --port P --socket PATH "
                         "[--watch-fd M] [--proxy-wait-s S] [--max-processes N] -- ARGV...")
    return opts, agent


CPU_KILL_AFTER_S = 5


def _not_dumpable() -> None:
    """Make this process non-dumpable (prctl(2) PR_SET_DUMPABLE 0).

    The agent runs with the relay's uid: without this it could ptrace the
    relay or read /proc/1/mem and /proc/1/fd, and forge the stage times and
    exit status the relay reports. A non-dumpable process cannot be attached
    to or read by a process without CAP_SYS_PTRACE, which the agent lacks.
    The agent itself, exec'd afterwards, is dumpable again, as usual.
    """
    import ctypes

    PR_SET_DUMPABLE = 4
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            report("warning", "prctl-dumpable", ctypes.get_errno())
    except OSError:
        report("warning", "prctl-unavailable")


def _released(fd: int) -> bool:
    """Wait for the runner's one byte on the hold pipe ``fd`` (step 2); False when it closed the
    pipe without it. The descriptor is closed either way."""
    try:
        while True:
            try:
                return os.read(fd, 1) == b"g"
            except InterruptedError:
                continue
            except OSError:
                return False
    finally:
        os.close(fd)


def main(argv) -> int:
    """Entry point inside the sandbox (``argv``: the relay's options, ``--``, the agent's command):
    PID 1, the loopback listener and the agent. Returns the exit status."""
    global _status_fd, _agent_pid
    opts, agent = _parse(argv)
    _status_fd = int(opts["--status-fd"])
    _not_dumpable()
    # Nothing of ours reaches the agent: every descriptor above stderr closes on exec.
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass
    for signum in FORWARDED:
        signal.signal(signum, _on_signal)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(opts["--port"])))
    listener.listen(128)
    if opts["--max-processes"] is not None:
        import resource

        limit = int(opts["--max-processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    _set_limits(opts)
    # The relay's own threads start before the agent can use up the process limit.
    threading.Thread(target=_accept, args=(listener, opts["--socket"], float(opts["--proxy-wait-s"])),
                     daemon=True).start()
    if opts["--watch-fd"] is not None:
        threading.Thread(target=_watch, args=(int(opts["--watch-fd"]),), daemon=True).start()
    report("ready", time.monotonic_ns())
    if opts["--hold-fd"] is not None and not _released(int(opts["--hold-fd"])):
        report("spawn-error", 0, "the runner did not release the sandbox (its work directory could not be held)")
        return 125

    if _pending:
        report("exited", "signal", _pending[0], time.monotonic_ns())
        return 128 + _pending[0]
    try:
        _agent_pid = os.posix_spawnp(
            agent[0], agent, dict(os.environ), setsigmask=(), setsigdef=DEFAULTED,
            file_actions=[(os.POSIX_SPAWN_DUP2, int(opts["--stdout-fd"]), 1),
                          (os.POSIX_SPAWN_DUP2, int(opts["--stderr-fd"]), 2)])
    except OSError as exc:
        report("spawn-error", exc.errno or 0, (exc.strerror or str(exc)).replace("\n", " "))
        return 127
    report("started", time.monotonic_ns())
    if _pending:
        os.kill(-1, _pending[0])

    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            report("exited", "unknown", 0, time.monotonic_ns())
            return 1
        if pid == _agent_pid:
            break
    now = time.monotonic_ns()
    if os.WIFSIGNALED(status):
        report("exited", "signal", os.WTERMSIG(status), now)
        return 128 + os.WTERMSIG(status)
    report("exited", "code", os.waitstatus_to_exitcode(status), now)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    # os._exit: no interpreter teardown while relay threads still hold sockets.
    os._exit(code)
