"""Escape tests: an agent in the real bubblewrap sandbox tries every way out (BUG-20).

The runner runs tests/integration/sandbox_probes.py as its agent, under a
policy that allows only ``POST /v1/messages`` on the stand-in model. Every
target is a server THIS test starts on the host's loopback: the stand-in
model API (demo/demo_model.py) on 127.0.0.1, a forbidden server on
127.0.0.2 and ::1 that records every connection, and a recording resolver on
127.0.0.53. The sandbox has its own network namespace, so the host's
loopback is another network: reaching it at all is an escape. No probe aims
at a public or private-range address.

One deviation from BUG-20's setup: the submit account may not bind port 53,
so the recording resolver listens on 127.0.0.53 at an unprivileged port and
the probes query both that port and 53.
"""
from __future__ import annotations

import json
import os
import shutil
import secrets
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import model_api_policy

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Made afresh for each run: a literal here would be in this file (and its bytecode), which the probes
# read when the checkout is somewhere the sandbox may read (a clone under /tmp: the fresh clone's
# `make test` failed p10 on its own source).
SECRET = "sk-tco-escape-" + secrets.token_hex(12)
MARKER = "tcoescape7f3a"
CAMPAIGN = "esc"


def free_port(host: str = "127.0.0.1", family=socket.AF_INET) -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.lock = threading.Lock()

    def add(self, *event) -> None:
        with self.lock:
            self.events.append(event)


def tcp_recorder(host: str, port: int, recorder: Recorder, family=socket.AF_INET):
    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.settimeout(1)
            try:
                data = self.request.recv(4096)
            except OSError:
                data = b""
            recorder.add("tcp", host, self.client_address, data)

    class Server(socketserver.ThreadingTCPServer):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def udp_recorder(host: str, port: int, recorder: Recorder):
    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            recorder.add("udp", host, self.client_address, self.request[0])

    server = socketserver.ThreadingUDPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {host}:{port}")


@pytest.fixture(scope="module")
def escape(tmp_path_factory):
    """Start the servers, run the probes in the sandbox once, return what happened."""
    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap (bwrap) is not installed; apt-get install bubblewrap")
    root = tmp_path_factory.mktemp("escape")
    # The probes are listed where they are: nothing inside the host's /tmp (the tests' root)
    # can be listed, it is other tasks' scratch space (issue 11, finding 4).
    spool, probe_dir = root / "spool", REPO / "tests" / "integration"
    key_file, creds = root / "model.key", root / "credentials.json"
    key_file.write_text(SECRET + "\n")
    creds.write_text(json.dumps({"escape-test": SECRET}))
    creds.chmod(0o600)
    state = root / "state"
    state.mkdir()
    (state / "secret_key").write_text("state-dir-secret\n")

    model_port = free_port()
    forbidden_port = free_port("127.0.0.2")
    resolver_port = free_port("127.0.0.53")
    forbidden, resolver = Recorder(), Recorder()
    servers = [tcp_recorder("127.0.0.2", forbidden_port, forbidden),
               tcp_recorder("::1", forbidden_port, forbidden, socket.AF_INET6),
               udp_recorder("127.0.0.2", forbidden_port, forbidden),
               udp_recorder("127.0.0.53", resolver_port, resolver),
               tcp_recorder("127.0.0.53", resolver_port, resolver)]
    model = subprocess.Popen([sys.executable, "-m", "demo.demo_model", "--port", str(model_port),
                              "--api-key-file", str(key_file)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", model_port)
        other = spool / "work" / CAMPAIGN / "2"
        other.mkdir(parents=True)
        (other / "secret.txt").write_text("another agent's work\n")
        campaign_dir = spool / "campaigns" / CAMPAIGN
        campaign_dir.mkdir(parents=True)
        inputs = {"model_host": "127.0.0.1", "model_port": model_port, "forbidden_host": "127.0.0.2",
                  "forbidden_port": forbidden_port, "resolver_port": resolver_port, "marker": MARKER,
                  "spool": str(spool), "other_workdir": str(other), "credentials_file": str(creds),
                  "state_secret": str(state / "secret_key")}
        (campaign_dir / "inputs.jsonl").write_text(json.dumps(inputs) + "\n")
        policy = model_api_policy(model_port, "/usr/bin/python3.11", [probe_dir])
        spec = {"version": 1, "campaign_id": CAMPAIGN, "inputs_file": "inputs.jsonl", "timeout_s": 120,
                "agent": {"command": ["/usr/bin/python3", str(probe_dir / "sandbox_probes.py")],
                          "outputs": ["probes.json"]},
                "policy": policy,
                "model_endpoint": {"base_url": f"http://127.0.0.1:{model_port}", "credential_name": "escape-test"}}
        (campaign_dir / "spec.json").write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_"))}
        env.update(TCO_SPOOL_DIR=str(spool), TCO_CAMPAIGN_ID=CAMPAIGN, JOB_ID="77", SGE_TASK_ID="1",
                   TCO_CREDENTIALS_FILE=str(creds), TCO_SANDBOX_MASK=str(state), PYTHONPATH=str(REPO),
                   PYTHONDONTWRITEBYTECODE="1", HTTP_PROXY=f"http://127.0.0.2:{forbidden_port}",
                   https_proxy=f"http://127.0.0.2:{forbidden_port}")
        result = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, cwd=str(root), timeout=180,
                                capture_output=True, text=True, start_new_session=True)
        record = json.loads((spool / "records" / CAMPAIGN / "1.json").read_text())
        work = spool / "work" / CAMPAIGN / "1"
        assert (work / "probes.json").exists(), (result.stderr, record,
                                                 Path(record["stderr_path"]).read_text() if record["stderr_path"] else "")
        with urllib.request.urlopen(f"http://127.0.0.1:{model_port}/_stand_in/served", timeout=10) as resp:
            served = json.loads(resp.read())
        time.sleep(0.5)  # a late packet would still be recorded
        yield {"result": result, "record": record, "probes": json.loads((work / "probes.json").read_text()),
               "haystack": (work / "haystack.txt").read_bytes(), "forbidden": forbidden, "resolver": resolver,
               "served": served, "spool": spool, "work": work}
    finally:
        model.terminate()
        model.wait(10)
        for server in servers:
            server.shutdown()
            server.server_close()


def test_the_probe_run_itself_succeeded(escape):
    assert escape["result"].returncode == 0, escape["result"].stderr
    assert escape["record"]["exit_status"] == 0 and escape["record"]["flags"] == []
    assert escape["record"]["sandbox"]["runtime"] == "bubblewrap"


def test_p1_the_model_is_reached_through_the_proxy_only_and_metered(escape):
    p1 = escape["probes"]["P1_model_through_proxy"]
    assert p1["status"] == 200 and "[stand-in]" in p1["body"]  # the model checked the key the proxy added
    usage = escape["record"]["usage"]
    # P1 and P9 are the only requests the policy allows.
    assert usage["forwarded"] == 2 and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    lines = [json.loads(line) for line in Path(escape["record"]["requests_path"]).read_text().splitlines()]
    assert [r["status"] for r in lines if r["refused"] is None] == [200, 200]
    assert all(r["usage"]["input_tokens"] > 0 for r in lines if r["refused"] is None)
    # The model served exactly those two, and refused nothing: no request without the key reached it.
    assert escape["served"]["totals"]["requests"] == 2 and escape["served"]["rejected"] == {}
    assert escape["served"]["totals"]["input_tokens"] == usage["input_tokens"]


@pytest.mark.parametrize("name", ["P2_connect_forbidden", "P2_absolute_get_forbidden", "P3_absolute_post_forbidden",
                                  "P3_absolute_post_model_https"])
def test_p2_p3_the_proxy_refuses_other_targets(escape, name):
    answer = escape["probes"][name]["ok"]
    assert answer["status"] == 403 and answer["refused"] in ("connect", "host_not_allowed"), answer


def test_p4_p5_p6_no_direct_connection_reaches_the_host(escape):
    p4, p5, p6 = (escape["probes"][k] for k in ("P4_direct_forbidden_no_proxy", "P5_direct_model", "P6_sockets"))
    assert p4["proxy_env"] == []  # the runner's proxy variables never reach the agent
    assert p4["tcp"]["error"] == "ECONNREFUSED" and "error" in p4["http"]
    assert p5["error"] == "ECONNREFUSED"
    for label in ("v4_model", "v4_forbidden", "v6_model", "v6_forbidden"):
        assert p6[label]["error"] == "ECONNREFUSED", (label, p6[label])
    for label in ("raw_icmp", "raw_icmpv6", "packet"):
        assert p6[label]["error"] == "EPERM", (label, p6[label])
    assert p6["interfaces"] == ["lo"]


def test_the_forbidden_server_saw_nothing(escape):
    assert escape["forbidden"].events == []


def test_p7_no_name_lookup_leaves_the_sandbox(escape):
    p7 = escape["probes"]["P7_dns"]
    assert "error" in p7["getaddrinfo"] and "error" in p7["gethostbyname"]
    assert {"udp_53", "tcp_53"} <= set(p7) and len([k for k in p7 if k.startswith(("udp_", "tcp_"))]) == 4
    for key, value in p7.items():
        if key.startswith(("udp_", "tcp_")):
            assert "error" in value, (key, value)
    assert "ok" not in p7["resolv_conf"] or p7["resolv_conf"]["ok"] == ""
    assert escape["resolver"].events == []


def test_p8_a_relay_inside_the_sandbox_changes_nothing(escape):
    answer = escape["probes"]["P8_inner_relay_connect"]["connect"]["ok"]
    assert answer["status"] == 403 and answer["refused"] == "connect"


def test_p9_the_host_header_never_retargets(escape):
    p9 = escape["probes"]["P9_host_header"]
    assert p9["status"] == 200 and "[stand-in]" in p9["body"]  # went to the model, not elsewhere
    assert escape["forbidden"].events == []


def test_p10_the_credential_is_nowhere_inside(escape):
    assert SECRET.encode() not in escape["haystack"]
    assert b"ANTHROPIC_BASE_URL" in escape["haystack"]  # the haystack did hold the environment
    files = escape["probes"]["files"]
    for key in files:
        if key.startswith("read "):
            assert "error" in files[key], (key, files[key])


def test_writes_outside_the_read_write_paths_fail(escape):
    files = escape["probes"]["files"]
    for key, value in files.items():
        if key.startswith("write ") and key not in ("write /sandbox/ok", "write /tmp/ok"):
            assert value["error"] in ("EROFS", "ENOENT", "EACCES", "EPERM"), (key, value)
    assert "ok" in files["write /sandbox/ok"] and "ok" in files["write /tmp/ok"]
    assert (escape["work"] / "ok").read_text() == "escape"
    assert not (escape["spool"] / "x").exists()
    assert files["listdir /run/tco"] == {"ok": ["proxy.sock"]}
    assert "spool" not in " ".join(files["listdir /"])


def test_another_agents_work_directory_is_not_visible(escape):
    files = escape["probes"]["files"]
    other = [k for k in files if k.startswith("read ") and "secret.txt" in k]
    assert len(other) == 2 and all(files[k]["error"] == "ENOENT" for k in other)


def test_the_agent_is_not_root_has_no_capabilities_and_no_terminal(escape):
    proc = escape["probes"]["process"]
    assert proc["uid"] == 1000 and proc["euid"] == 1000 and proc["gid"] == 1000
    assert int(proc["cap_eff"], 16) == 0 and int(proc["cap_bnd"], 16) == 0 and proc["no_new_privs"] == "1"
    assert proc["hostname"] == "sandbox"
    assert proc["dev_tty"]["error"] == "ENXIO"  # no controlling terminal: a new session
    assert proc["tiocsti"]["error"] in ("ENOTTY", "EIO", "EPERM")
    assert proc["nested_userns"] != {"ok": 0}  # --disable-userns
    # Only the sandbox's own processes: the relay (PID 1) and the agent.
    assert set(proc["pids"]) >= {1, proc["pid"]} and len(proc["pids"]) <= 4, proc["cmdlines"]
    assert "relay" in proc["cmdlines"]["1"] and not any("execution.runner" in c for c in proc["cmdlines"].values())
    assert proc["fds"] == ["0", "1", "2", "3"]  # 3 is the listdir itself: nothing inherited


def test_the_agent_cannot_reach_into_the_relay_that_reports_its_stages(escape):
    tamper = escape["probes"]["relay_tamper"]
    assert tamper["ptrace"]["error"] == "EPERM", tamper
    assert tamper["mem"]["error"] in ("EACCES", "EPERM"), tamper
    assert tamper["fds"]["error"] in ("EACCES", "EPERM"), tamper


def test_the_record_tells_the_stages_and_what_was_refused(escape):
    record = escape["record"]
    stages = record["stages"]
    order = ["task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
             "teardown_done_at"]
    assert all(stages[s] for s in order) and [stages[s] for s in order] == sorted(stages[s] for s in order)
    assert record["usage"]["refused"] >= 5 and record["usage"]["refused_by_reason"].get("connect", 0) >= 2
    assert [o["name"] for o in record["outputs"]] == ["probes.json"]
    assert any("binaries" in note for note in record["sandbox"]["notes"])


# ------------------------------------------------------------------------------------------ issue 11
# Each test below runs the runner once with its own spool, policy and agent (python3 -c CODE).

AGENT_PYTHON = "/usr/bin/python3.11"
SYSTEM_RO = ["/usr", "/lib", "/lib64", "/bin", "/etc"]


def run_task(root: Path, code: str, *, read_only=(), read_write=(), network: str = "", env_extra=None,
             spec_extra=None, timeout_s: int = 120):
    """Run one task whose agent is ``python3 -c code``; returns (completed runner, record, agent stdout)."""
    spool = root / "spool"
    campaign_dir = spool / "campaigns" / "t"
    campaign_dir.mkdir(parents=True)
    (campaign_dir / "inputs.jsonl").write_text("{}\n")
    policy = (f"version: 1\nfilesystem_policy:\n  include_workdir: true\n"
              f"  read_only: [{', '.join([*SYSTEM_RO, *map(str, read_only)])}]\n"
              f"  read_write: [{', '.join(['/sandbox', '/tmp', *map(str, read_write)])}]\n"
              f"process: {{run_as_user: sandbox, run_as_group: sandbox}}\n" + network)
    spec = {"version": 1, "campaign_id": "t", "inputs_file": "inputs.jsonl", "timeout_s": timeout_s,
            "agent": {"command": ["/usr/bin/python3", "-c", code]}, "policy": policy, **(spec_extra or {})}
    (campaign_dir / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TCO_", "SGE_", "JOB_"))}
    env.update(TCO_SPOOL_DIR=str(spool), TCO_CAMPAIGN_ID="t", JOB_ID="77", SGE_TASK_ID="1",
               PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", **(env_extra or {}))
    result = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, cwd=str(root), timeout=300,
                            capture_output=True, text=True, start_new_session=True)
    record = json.loads((spool / "records" / "t" / "1.json").read_text())
    stdout = Path(record["stdout_path"]).read_text() if record["stdout_path"] else ""
    return result, record, stdout


@pytest.fixture
def outside_tmp():
    """A directory outside the host's /tmp (whose inside no policy may list at all), for
    what must be refused for being tco's, not for being in /tmp."""
    path = Path(tempfile.mkdtemp(prefix=".tco-sandbox-test-", dir=os.path.expanduser("~")))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class HttpRecorder:
    """A launcher's own HTTP server on the host's loopback: keeps every request, answers 200."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        recorder = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = self.rfile.readline()
                    if not line:
                        return
                    head += line
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                recorder.requests.append(head + self.rfile.read(length))
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def rest_endpoint(key: str, port: int, provider: str) -> str:
    return (f"  {key}:\n    endpoints:\n      - host: 127.0.0.1\n        port: {port}\n        protocol: rest\n"
            f"        enforcement: enforce\n        credential_binding: {{provider: {provider}}}\n"
            f"        rules: [{{allow: {{method: POST, path: /v1/messages}}}}]\n"
            f"    binaries: [{{path: {AGENT_PYTHON}}}]\n")


def test_issue11_a_launchers_endpoint_never_gets_the_sites_key(tmp_path):
    """Finding 2: a policy endpoint on the launcher's own port naming ``credential_binding:
    {provider: demo-stand-in}`` (the site's credential's name), listed first. It receives
    neither an Authorization header nor the secret; the registered model still gets its key."""
    key_file, creds = tmp_path / "model.key", tmp_path / "credentials.json"
    key_file.write_text(SECRET + "\n")
    creds.write_text(json.dumps({"demo-stand-in": SECRET}))
    creds.chmod(0o600)
    model_port = free_port()
    attacker = HttpRecorder()
    model = subprocess.Popen([sys.executable, "-m", "demo.demo_model", "--port", str(model_port),
                              "--api-key-file", str(key_file)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = f"""
import http.client, json
body = json.dumps({{"model": "m", "max_tokens": 8, "messages": [{{"role": "user", "content": "hi"}}]}})
out = {{}}
for label, target in (("absolute", "http://127.0.0.1:{attacker.port}/v1/messages"), ("origin", "/v1/messages")):
    conn = http.client.HTTPConnection("127.0.0.1", 8790, timeout=30)
    conn.request("POST", target, body, {{"content-type": "application/json", "anthropic-version": "2023-06-01"}})
    resp = conn.getresponse()
    out[label] = [resp.status, resp.read().decode("utf-8", "replace")[:200]]
print(json.dumps(out))
"""
    try:
        wait_port("127.0.0.1", model_port)
        network = ("network_policies:\n" + rest_endpoint("launchers", attacker.port, "demo-stand-in")
                   + rest_endpoint("model_api", model_port, "anthropic"))
        registered = [{"name": "stand-in", "provider": "anthropic", "scheme": "http", "host": "127.0.0.1",
                       "port": model_port, "path_prefixes": ["/v1"], "credential_name": "demo-stand-in"}]
        result, record, stdout = run_task(tmp_path, code, network=network,
                                          env_extra={"TCO_CREDENTIALS_FILE": str(creds)},
                                          spec_extra={"model_endpoints": registered})
        with urllib.request.urlopen(f"http://127.0.0.1:{model_port}/_stand_in/served", timeout=10) as resp:
            served = json.loads(resp.read())
    finally:
        model.terminate()
        model.wait(10)
        attacker.close()
    assert result.returncode == 0, (result.stderr, record)
    answers = json.loads(stdout)
    assert answers["absolute"][0] == 200 and answers["origin"][0] == 200, answers
    assert "[stand-in]" in answers["origin"][1]  # the model accepted the key the proxy added
    [request] = attacker.requests
    head = request.split(b"\r\n\r\n", 1)[0].lower()
    assert b"authorization:" not in head and b"x-api-key:" not in head, head
    assert SECRET.encode() not in request
    assert served["totals"]["requests"] == 1 and served["rejected"] == {}
    assert any("launchers" in note and "not a registered model endpoint" in note for note in record["sandbox"]["notes"])


def test_issue11_tcos_state_files_cannot_be_listed(outside_tmp):
    """Finding 2: the policy listed var/secret_key and var/admin-password read-only and read them."""
    state = outside_tmp / "var"
    state.mkdir()
    for name in ("secret_key", "admin-password"):
        (state / name).write_text(f"{MARKER}-{name}\n")
    link = outside_tmp / "innocent"
    link.symlink_to(state / "secret_key")
    code = "import sys; print(open(sys.argv[1]).read())"
    for listed in (state / "secret_key", state / "admin-password", state, link):
        root = outside_tmp / f"run-{listed.name}"
        root.mkdir()
        result, record, stdout = run_task(root, code, read_only=[listed], env_extra={"TCO_SANDBOX_MASK": str(state)})
        assert result.returncode == 78 and record["flags"] == ["runner_error"], (listed, record)
        assert f"is inside {state}" in record["error"] and MARKER not in stdout + record["error"]
        assert record["stages"]["sandbox_create_at"] is None


def test_issue11_another_tasks_scratch_and_proxy_socket_are_out_of_reach(outside_tmp):
    """Finding 4: task A listed task B's TMPDIR, connected to B's proxy socket and was served
    with B's credential. B's TMPDIR is a sibling of A's (Grid Engine's <job>.<task>.<queue>)."""
    import socket as socketlib

    scratch = outside_tmp / "scratch"
    own, other = scratch / "77.1.all.q", scratch / "78.1.all.q"
    sock_dir = other / "tco-runner-9-0" / "sock"
    sock_dir.mkdir(parents=True)
    own.mkdir()
    served = Recorder()
    server = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    server.bind(str(sock_dir / "proxy.sock"))
    server.listen(5)
    server.settimeout(0.2)

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except socketlib.timeout:
                continue
            except OSError:
                return
            served.add("connection")
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    code = ("import socket, sys; s = socket.socket(socket.AF_UNIX); "
            "s.connect(sys.argv[1] + '/tco-runner-9-0/sock/proxy.sock'); print('connected')")
    try:
        for listed, also in ((other, ()), (scratch, ())):
            root = outside_tmp / f"run-{listed.name}"
            root.mkdir()
            result, record, stdout = run_task(root, code + "", read_write=[listed], env_extra={"TMPDIR": str(own)})
            assert result.returncode == 78 and "connected" not in stdout, (listed, record)
            assert "tco's own files" in record["error"], record["error"]
    finally:
        server.close()
    assert served.events == []


def test_issue11_shared_memory_and_lock_dirs_are_the_sandboxs_own(tmp_path):
    """Finding 4: listing /run/shm or /var/lock read-write showed the host's /dev/shm and /run/lock."""
    marker = Path("/dev/shm") / f"{MARKER}-{os.getpid()}"
    marker.write_text("host")
    code = ("import json, os\nout = {}\n"
            "for d in ('/run/shm', '/var/lock', '/dev/shm', '/run/lock'):\n"
            "    out[d] = sorted(os.listdir(d))\n"
            "    open(os.path.join(d, 'from-the-agent'), 'w').write('x')\n"
            "print(json.dumps(out))")
    try:
        result, record, stdout = run_task(tmp_path, code, read_write=["/run/shm", "/var/lock", "/dev/shm",
                                                                       "/run/lock"])
    finally:
        marker.unlink()
    assert result.returncode == 0, (result.stderr, record)
    seen = json.loads(stdout)
    assert seen == {"/run/shm": [], "/var/lock": [], "/dev/shm": [], "/run/lock": []}, seen
    assert not Path("/dev/shm/from-the-agent").exists() and not Path("/run/lock/from-the-agent").exists()


def test_issue11_a_fork_bomb_is_contained(tmp_path):
    """Finding 5: RLIMIT_NPROC in the sandbox's own user namespace; 300 forks stop near 32."""
    code = """
import errno, json, os, time
made, error = 0, None
for _ in range(300):
    try:
        pid = os.fork()
    except OSError as exc:
        error = errno.errorcode.get(exc.errno)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    made += 1
print(json.dumps({"made": made, "error": error}))
"""
    result, record, stdout = run_task(tmp_path, code, env_extra={"TCO_SANDBOX_MAX_PROCESSES": "32"})
    assert result.returncode == 0, (result.stderr, record)
    out = json.loads(stdout)
    assert out["error"] == "EAGAIN" and out["made"] < 32, out
    # the children died with the sandbox (the relay's exit ends its PID namespace)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, "os._exit(0)")]


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_issue11_writing_past_the_tmp_size_fails(tmp_path):
    """Finding 5: /tmp was a tmpfs of half the host's memory."""
    code = """
import errno, json
written, error = 0, None
with open("/tmp/big", "wb") as fh:
    try:
        for _ in range(64):
            fh.write(b"x" * (1 << 20))
            fh.flush()
            written += 1 << 20
    except OSError as exc:
        error = errno.errorcode.get(exc.errno)
print(json.dumps({"written": written, "error": error}))
"""
    result, record, stdout = run_task(tmp_path, code, env_extra={"TCO_SANDBOX_TMPFS_BYTES": str(8 << 20)})
    assert result.returncode == 0, (result.stderr, record)
    out = json.loads(stdout)
    assert out["error"] == "ENOSPC" and out["written"] <= 8 << 20, out


def test_issue11_a_work_directory_over_its_size_stops_the_agent(tmp_path):
    """Finding 5 (issue 11) and issue 23's finding 1: /sandbox had no quota. Now it is a tmpfs of
    TCO_SANDBOX_WORK_BYTES: the kernel refuses the write past it (ENOSPC, seen by the agent), and
    the runner ends the task once it is full."""
    code = ("import errno, time\ntry:\n    open('/sandbox/big', 'wb').write(b'x' * (6 << 20))\n    print('written')\n"
            "except OSError as exc:\n    print(errno.errorcode[exc.errno])\n"
            "import sys\nsys.stdout.flush()\ntime.sleep(120)")
    result, record, stdout = run_task(tmp_path, code, timeout_s=200,
                                      env_extra={"TCO_SANDBOX_WORK_BYTES": str(2 << 20),
                                                 "TCO_SANDBOX_WORK_CHECK_S": "0.2"})
    assert result.returncode == 122, (result.stderr, record)  # runner.EXIT_WORKDIR_QUOTA
    assert "workdir_over_quota" in record["flags"] and "agent_timeout" not in record["flags"]
    assert record["stages"]["agent_exited_at"] is None and record["stages"]["teardown_done_at"]
    assert stdout == "ENOSPC\n"
    assert record["sandbox"]["workdir"] == "tmpfs" and record["sandbox"]["work_bytes"] <= 2 << 20
    assert record["error"] == "work directory limit 2 MiB reached"


def test_review_tcos_secrets_outside_the_state_dir_stay_hidden_under_a_listed_etc(outside_tmp):
    """Review of a fresh clone: /etc listed read-only (as the default policy and the demo ceilings
    do) showed /etc/tco, where the Redis and PostgreSQL passwords and the database URL live, to
    every agent (it runs as tco's uid). The job's TCO_SANDBOX_MASK (dashboards.services) now
    names it; without that mask the same run reads the secret (so this test can fail)."""
    from dashboards.launch.spool import sandbox_state_paths

    secret = Path("/etc/tco/redis-password")
    if not os.access(secret, os.R_OK):
        pytest.skip("no readable /etc/tco/redis-password on this machine (scripts/dev-cluster writes it)")
    value = secret.read_text().strip()
    assert value and "/etc/tco" in sandbox_state_paths()
    code = ("import os\ntry:\n    print(sorted(os.listdir('/etc/tco')))\n    print(open('/etc/tco/redis-password').read())\n"
            "except OSError as exc:\n    print('refused', exc)\n")
    state = outside_tmp / "var"
    state.mkdir()
    masked = ":".join([str(state), *[p for p in sandbox_state_paths() if p.startswith("/etc")]])
    root = outside_tmp / "masked"
    root.mkdir()
    result, record, stdout = run_task(root, code, env_extra={"TCO_SANDBOX_MASK": masked})
    assert record["exit_status"] == 0, record
    # Neither the masked files' bytes nor their names (the directory is an empty tmpfs).
    assert value not in stdout and "database-url" not in stdout, stdout
    control = outside_tmp / "unmasked"
    control.mkdir()
    result, record, stdout = run_task(control, code, env_extra={"TCO_SANDBOX_MASK": str(state)})
    assert value in stdout, "without the mask the agent reads /etc/tco: the check above proves the mask"
