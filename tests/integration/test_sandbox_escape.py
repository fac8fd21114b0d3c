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
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-tco-escape-test-7f3a9c1e5d"
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
        policy = f"""\
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc, {probe_dir}]
  read_write: [/sandbox, /tmp]
process: {{run_as_user: sandbox, run_as_group: sandbox}}
network_policies:
  model_api:
    endpoints:
      - host: 127.0.0.1
        port: {model_port}
        protocol: rest
        enforcement: enforce
        credential_binding: {{provider: anthropic}}
        rules: [{{allow: {{method: POST, path: /v1/messages}}}}]
    binaries: [{{path: /usr/bin/python3.11}}]
"""
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
