"""The runner, run as Grid Engine runs it: a subprocess with an environment and a spool.

The agent is the bundled demo agent, in the runner's default bubblewrap
sandbox. Choices checked here (see execution/runner.py): a runner stopped by a
signal writes a record with ``agent_exited_at`` null (the agent did not end
by itself), ``teardown_done_at`` set, ``runner_signal`` set and exit status
128+signal.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execution.runner import config

from tests.support.runner import Spool, wait_for

REPO = Path(__file__).resolve().parents[3]
STAGE_ORDER = ["task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
               "teardown_done_at"]
SANDBOXED = ["task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at"]


def assert_stages_in_order(stages: dict, expected_present: list[str]) -> None:
    present = [name for name in STAGE_ORDER if stages[name] is not None]
    assert present == expected_present
    values = [stages[name] for name in present]
    for value in values:
        assert value.endswith("Z") and len(value) == len("2025-01-02T03:04:05.123456Z")
    assert values == sorted(values)


def live_processes_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != b"Z":
            found.append(int(name))
    return found


# --------------------------------------------------------------------------- normal runs

def test_it_writes_one_record_with_stages_in_order(spool):
    spool.write([{"task": 1, "duration_s": 0.2}, {"task": 2, "duration_s": 0.1}])
    result = spool.run(2)
    assert result.returncode == 0, result.stderr
    record = spool.record(2)
    assert record["version"] == 2
    assert (record["campaign_id"], record["task_number"], record["job_number"]) == ("c-1", 2, 4242)
    assert record["hostname"]
    assert_stages_in_order(record["stages"], STAGE_ORDER)
    assert (record["exit_status"], record["signal"], record["flags"]) == (0, None, [])
    assert record["runner_signal"] is None and record["error"] is None
    assert not spool.record_path(1).exists()
    # Only the record and its two output files; no temp file is left behind.
    assert sorted(p.name for p in spool.record_path(2).parent.iterdir()) == ["2.json", "2.stderr", "2.stdout"]


def test_the_agent_gets_its_input_and_work_dir(spool):
    spool.write([{"task": 7, "duration_s": 0}])
    assert spool.run(1).returncode == 0
    work = spool.root / "work" / "c-1" / "1"
    assert json.loads((work / "input.json").read_text()) == {"task": 7, "duration_s": 0}
    result = json.loads((work / "result.json").read_text())
    assert result["task"] == 7 and result["ok"] is True
    stdout = Path(spool.record(1)["stdout_path"]).read_text()
    assert stdout.startswith("demo agent (stand-in): task 7 answered ")


def test_the_agents_exit_status_is_passed_through(spool):
    spool.write([{"task": 1, "duration_s": 0, "fail": True}])
    result = spool.run(1)
    assert result.returncode == 3
    record = spool.record(1)
    assert record["exit_status"] == 3 and record["signal"] is None
    assert_stages_in_order(record["stages"], STAGE_ORDER)


def test_output_is_captured_and_capped(spool):
    cap = config.OUTPUT_CAP_BYTES
    spool.write([{"task": 1, "duration_s": 0, "stdout_bytes": cap + 500_000, "stderr_bytes": 10}])
    assert spool.run(1).returncode == 0
    record = spool.record(1)
    assert record["stdout_truncated"] is True and record["stderr_truncated"] is False
    assert os.path.getsize(record["stdout_path"]) == cap
    assert Path(record["stderr_path"]).read_text() == "e" * 10 + "\n"


def test_a_non_array_job_runs_as_task_one(spool):
    spool.write([{"task": 1, "duration_s": 0}])
    assert spool.run("undefined").returncode == 0
    assert spool.record(1)["flags"] == ["task_number_defaulted"]


def test_a_stray_child_is_killed_at_teardown(spool):
    spool.write([{"task": 1, "duration_s": 0, "spawn_child_s": 61.2345}], kill_grace_s=1)
    assert spool.run(1).returncode == 0
    assert spool.record(1)["exit_status"] == 0
    assert live_processes_with("time.sleep(61.2345)") == []


# --------------------------------------------------------------------------- interrupted runs

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGUSR1])
def test_a_signalled_runner_still_writes_a_record(spool, signum):
    spool.write([{"task": 1, "duration_s": 30}])
    proc = spool.start(1)
    wait_for(lambda: (spool.root / "records" / "c-1" / "1.stdout").exists())
    time.sleep(0.1)
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum
    record = spool.record(1)
    assert_stages_in_order(record["stages"], SANDBOXED + ["teardown_done_at"])
    assert record["stages"]["agent_exited_at"] is None
    assert record["runner_signal"] == signum
    assert record["flags"] == ["runner_signalled"]
    assert (record["exit_status"], record["signal"]) == (None, signal.SIGTERM)  # the runner's SIGTERM


def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace(spool):
    spool.write([{"task": 1, "duration_s": 30, "ignore_sigterm": True, "spawn_child_s": 62.3456}],
                kill_grace_s=0.5)
    proc = spool.start(1)
    wait_for(lambda: live_processes_with("time.sleep(62.3456)"))
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert time.monotonic() - started < 5
    record = spool.record(1)
    assert record["signal"] == signal.SIGKILL and proc.returncode == 128 + signal.SIGTERM
    assert live_processes_with("time.sleep(62.3456)") == []


def test_an_agent_past_its_timeout_is_stopped(spool):
    spool.write([{"task": 1, "duration_s": 30}], timeout_s=0.5)
    result = spool.run(1)
    assert result.returncode == config.EXIT_TIMEOUT
    record = spool.record(1)
    assert record["flags"] == ["agent_timeout"]
    assert record["stages"]["agent_exited_at"] is None and record["signal"] == signal.SIGTERM


# --------------------------------------------------------------------------- runner errors

def test_a_missing_spec_gives_a_runner_error_record(spool):
    result = spool.run(1)
    assert result.returncode == config.EXIT_CONFIG
    record = spool.record(1)
    assert record["flags"] == ["runner_error"] and "spec.json" in record["error"]
    assert record["stdout_path"] is None
    assert_stages_in_order(record["stages"], ["task_started_at", "teardown_done_at"])


def test_a_numeric_campaign_id_in_the_spec_matches_its_text_in_the_environment(tmp_path):
    spool = Spool(tmp_path / "spool", campaign_id="17")
    spool.write([{"task": 1, "duration_s": 0}], campaign_id=17)
    assert spool.run(1).returncode == 0
    assert spool.record(1)["campaign_id"] == "17"


def test_a_spec_for_another_campaign_is_refused(spool):
    spool.write([{"task": 1}], campaign_id="other")
    assert spool.run(1).returncode == config.EXIT_CONFIG
    assert "is for campaign 'other'" in spool.record(1)["error"]


def test_a_missing_input_line_gives_a_runner_error_record(spool):
    spool.write([{"task": 1}])
    assert spool.run(2).returncode == config.EXIT_CONFIG
    assert "no line 2" in spool.record(2)["error"]


def test_an_agent_that_cannot_start_gives_a_runner_error_record(spool):
    spool.write([{"task": 1}], command=["/nonexistent/agent", "{input}"])
    assert spool.run(1).returncode == config.EXIT_CONFIG
    assert "cannot start agent" in spool.record(1)["error"]


def test_without_a_spool_it_exits_without_a_record(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCO_")}
    env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, capture_output=True,
                            text=True, timeout=30, start_new_session=True)
    assert result.returncode == config.EXIT_CONFIG
    assert "TCO_SPOOL_DIR" in result.stderr


def test_a_campaign_id_cannot_escape_the_spool(spool):
    spool.write([{"task": 1}])
    env = spool.env(1)
    env["TCO_CAMPAIGN_ID"] = "../../etc"
    result = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, capture_output=True,
                            text=True, timeout=30, start_new_session=True)
    assert result.returncode == config.EXIT_CONFIG and "TCO_CAMPAIGN_ID" in result.stderr


# --------------------------------------------------------------------------- start-up

# --------------------------------------------------------------------------- the sandbox

PROBE = """
import json, os, sys
print(json.dumps({"uid": os.getuid(), "cwd": os.getcwd(), "env": sorted(os.environ),
                  "base_url": os.environ.get("ANTHROPIC_BASE_URL"), "spool_visible": os.path.exists(sys.argv[1]),
                  "input": open(os.environ["TCO_INPUT_FILE"]).read()}))
"""


def test_the_agent_runs_sandboxed_as_a_non_root_user_with_a_clean_environment(spool, tmp_path):
    spool.write([{"task": 1}], command=[sys.executable, "-c", PROBE, str(spool.root)])
    env_extra = {"SECRET_LOOKING_VAR": "x"}
    proc = subprocess.run([sys.executable, "-m", "execution.runner"], env={**spool.env(1), **env_extra},
                          cwd=str(spool.root), capture_output=True, timeout=60, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    record = spool.record(1)
    seen = json.loads(Path(record["stdout_path"]).read_text())
    assert seen["uid"] == 1000 and seen["cwd"] == "/sandbox" and seen["spool_visible"] is False
    assert seen["base_url"] == "http://127.0.0.1:8790"
    assert json.loads(seen["input"]) == {"task": 1}
    assert "SECRET_LOOKING_VAR" not in seen["env"] and "TCO_SPOOL_DIR" not in seen["env"]
    assert record["sandbox"]["runtime"] == "bubblewrap" and record["sandbox"]["uid"] == 1000
    # The proxy starts only when the agent uses its base URL: this one did not.
    assert record["usage"] is None and record["requests_path"] is None


def test_the_runners_private_directory_is_removed(spool, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spool.write([{"task": 1, "duration_s": 0}])
    env = {**spool.env(1), "TMPDIR": str(scratch)}
    assert subprocess.run([sys.executable, "-m", "execution.runner"], env=env, timeout=60,
                          start_new_session=True).returncode == 0
    assert list(scratch.iterdir()) == []


def test_declared_outputs_are_copied_and_links_are_not_followed(spool, tmp_path):
    code = ("import os; open('verdict.json','w').write('{\"verdict\": \"ok\"}'); "
            "os.makedirs('sub', exist_ok=True); open('sub/a.txt','w').write('a'); "
            "os.symlink('/etc/passwd', 'leak.txt'); os.symlink('/etc', 'linkdir')")
    spool.write([{"task": 1}], command=[sys.executable, "-c", code],
                agent_extra={"outputs": ["verdict.json", "sub/*.txt", "leak.txt", "linkdir/passwd", "missing.json"]})
    assert spool.run(1).returncode == 0
    record = spool.record(1)
    assert [o["name"] for o in record["outputs"]] == ["verdict.json", "sub/a.txt"]
    assert Path(record["outputs"][0]["path"]).read_text() == '{"verdict": "ok"}'
    assert record["flags"] == ["outputs_skipped"]


def test_an_invalid_policy_is_a_runner_error_naming_every_problem(spool):
    spool.write([{"task": 1}], policy="version: 1\nfilesystem_policy:\n  read_onyl: [/usr]\n  read_write: ['/']\n")
    assert spool.run(1).returncode == config.EXIT_CONFIG
    record = spool.record(1)
    assert record["flags"] == ["runner_error"]
    assert "filesystem_policy.read_onyl: unknown field (did you mean 'read_only'?)" in record["error"]
    assert "read_write cannot contain '/'" in record["error"]
    assert record["stages"]["sandbox_create_at"] is None


def test_a_policy_bubblewrap_cannot_enforce_is_refused(spool):
    policy = ("version: 1\nnetwork_policies:\n  api:\n    endpoints:\n      - {host: a.example.com, port: 443, "
              "protocol: rest, rules: [{allow: {method: GET, path: /}}], deny_rules: [{method: GET, path: /x}]}\n"
              "    binaries: [{path: /usr/bin/python3}]\n")
    spool.write([{"task": 1}], policy=policy)
    assert spool.run(1).returncode == config.EXIT_CONFIG
    assert "deny_rules: not enforced by the metering proxy" in spool.record(1)["error"]


def test_a_model_endpoint_outside_the_policy_is_refused(spool):
    spool.write([{"task": 1}], model_endpoint={"base_url": "http://127.0.0.1:9", "credential_name": "x"})
    assert spool.run(1).returncode == config.EXIT_CONFIG
    assert "is not a protocol: rest endpoint of the sandbox policy" in spool.record(1)["error"]


def test_a_link_left_in_the_work_directory_is_not_written_through(spool, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    work = spool.root / "work" / "c-1" / "1"
    work.mkdir(parents=True)
    (work / "input.json").symlink_to(victim)
    spool.write([{"task": 1, "duration_s": 0}])
    assert spool.run(1).returncode == 0
    assert victim.read_text() == "untouched"
    assert json.loads((work / "input.json").read_text()) == {"task": 1, "duration_s": 0}


def test_the_sandbox_is_stopped_and_continued_with_the_runner(tmp_path):
    # The sandbox has its own session, out of the runner's process group; its relay follows
    # the runner's state, so stopping the job's process group stops the agent too.
    campaign = f"stop-{os.getpid()}"
    spool = Spool(tmp_path / "spool", campaign_id=campaign)
    spool.write([{"task": 1, "duration_s": 30}])
    proc = spool.start(1)

    def agent_states():
        states = []
        for pid in live_processes_with("demo.demo_agent"):
            try:
                if b"tco-relay" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                if f"TCO_CAMPAIGN_ID={campaign}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    states.append(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0])
            except OSError:
                continue
        return states

    wait_for(lambda: agent_states() in ([b"S"], [b"R"]))
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: agent_states() == [b"T"], timeout=5)
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    wait_for(lambda: agent_states() in ([b"S"], [b"R"]), timeout=5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert spool.record(1)["runner_signal"] == signal.SIGTERM


# ------------------------------------------- issue 11 finding 8: the runner refuses what checks.refusals names


RO_PREFIX = "version: 1\nfilesystem_policy:\n  read_only: [/usr, /lib, /lib64, /bin, /etc, "


@pytest.mark.parametrize("policy", [
    RO_PREFIX + "/proc/1/root]\n",
    RO_PREFIX + "{spool}/work]\n",
    RO_PREFIX + "{spool}/credentials.json]\n",
    RO_PREFIX + "{state}/secret_key, {state}]\n",
    RO_PREFIX + "/tmp/4243.1.all.q]\n  read_write: [/run/tco]\n",
    "version: 1\nnetwork_policies:\n  api:\n    endpoints:\n      - {{host: a.example.com, port: 443, protocol: rest, "
    "rules: [{{allow: {{method: GET, path: /}}}}], deny_rules: [{{method: GET, path: /x}}]}}\n"
    "    binaries: [{{path: /usr/bin/python3}}]\n",
])
def test_the_runner_refuses_exactly_what_checks_refusals_names(spool, tmp_path, policy):
    from execution.sandbox.checks import refusals, runner_masked_paths

    state = tmp_path / "state"
    state.mkdir()
    (state / "secret_key").write_text("k")
    text = policy.format(spool=spool.root, state=state)
    spool.write([{"task": 1}], policy=text)
    env = {**spool.env(1), "TCO_SANDBOX_MASK": str(state)}
    env.pop("TMPDIR", None)
    proc = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, cwd=str(spool.root),
                          capture_output=True, timeout=60, start_new_session=True)
    assert proc.returncode == config.EXIT_CONFIG
    # What the launch form would compute with the same settings (the runner adds its TMPDIR, /tmp here).
    expected = refusals(text, masked_paths=runner_masked_paths(spool=str(spool.root)) + ["/tmp"],
                        state_paths=[str(state)])
    assert expected, text
    record = spool.record(1)
    assert record["error"] == "the runner refuses this sandbox policy: " + "; ".join(expected)
    assert record["stages"]["sandbox_create_at"] is None


@pytest.mark.parametrize("name,value", [("TCO_SANDBOX_MAX_PROCESSES", "lots"), ("TCO_PROXY_MAX_BODY_BYTES", "0"),
                                        ("TCO_SANDBOX_WORK_CHECK_S", "-1")])
def test_a_bad_limit_is_a_configuration_error_before_the_agent_starts(spool, name, value):
    spool.write([{"task": 1, "duration_s": 0}])
    proc = subprocess.run([sys.executable, "-m", "execution.runner"], env={**spool.env(1), name: value},
                          cwd=str(spool.root), capture_output=True, timeout=60, start_new_session=True)
    assert proc.returncode == config.EXIT_CONFIG
    record = spool.record(1)
    assert record["error"].startswith(f"{name}={value!r}") and record["stages"]["sandbox_create_at"] is None


def test_the_proxy_limits_reach_the_proxy(spool, tmp_path):
    # One limit set, the others the proxy's defaults: a body over 1000 bytes is refused (413).
    from execution.metering.endpoints import Limits

    code = ("import http.client\nc = http.client.HTTPConnection('127.0.0.1', 8790, timeout=30)\n"
            "c.request('POST', '/v1/messages', b'x' * 5000, {'content-type': 'application/json'})\n"
            "print(c.getresponse().status)")
    policy = ("version: 1\nfilesystem_policy: {include_workdir: true, read_only: [/usr, /lib, /lib64, /bin, /etc], "
              "read_write: [/sandbox, /tmp]}\nnetwork_policies:\n  m:\n    endpoints:\n      - {host: 127.0.0.1, "
              "port: 9, protocol: rest, rules: [{allow: {method: POST, path: /v1/messages}}]}\n"
              "    binaries: [{path: /usr/bin/python3.11}]\n")
    spool.write([{"task": 1}], command=["/usr/bin/python3", "-c", code], policy=policy)
    proc = subprocess.run([sys.executable, "-m", "execution.runner"],
                          env={**spool.env(1), "TCO_PROXY_MAX_BODY_BYTES": "1000"}, cwd=str(spool.root),
                          capture_output=True, timeout=60, start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    record = spool.record(1)
    assert Path(record["stdout_path"]).read_text() == "413\n"
    assert record["usage"]["refused_by_reason"] == {"body_too_large": 1}
    assert Limits().max_body_bytes > 5000  # without the setting it would have gone through


def test_under_openshell_the_launchers_endpoint_with_a_binding_is_refused(spool, tmp_path):
    # The attack on the OpenShell runtime, which injects a bound provider's credential itself.
    standin_dir = tmp_path / "standin"
    standin_dir.mkdir()
    policy = ("version: 1\nfilesystem_policy: {include_workdir: true, read_only: [/usr, /lib, /etc], "
              "read_write: [/sandbox, /tmp]}\nnetwork_policies:\n  m:\n    endpoints:\n"
              "      - {host: api.anthropic.com, port: 443, protocol: rest, credential_binding: {provider: anthropic},"
              " rules: [{allow: {method: POST, path: /v1/messages}}]}\n"
              "      - {host: launcher.example.com, port: 443, protocol: rest, credential_binding: "
              "{provider: anthropic}, rules: [{allow: {method: POST, path: /v1/messages}}]}\n"
              "    binaries: [{path: /usr/bin/python3}]\n")
    spool.write([{"task": 1}], policy=policy,
                model_endpoint={"base_url": "https://api.anthropic.com", "credential_name": "anthropic-prod"})
    standin = REPO / "tests" / "fixtures" / "openshell-standin"
    env = {**spool.env(1), "TCO_SANDBOX_RUNTIME": "openshell", "OPENSHELL_STANDIN_DIR": str(standin_dir),
           "PATH": f"{standin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    proc = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, cwd=str(spool.root),
                          capture_output=True, timeout=60, start_new_session=True)
    assert proc.returncode == config.EXIT_CONFIG
    error = spool.record(1)["error"]
    assert "endpoints[1].credential_binding: launcher.example.com:443 is not a registered model endpoint" in error
    assert "endpoints[0]" not in error
    assert list(standin_dir.iterdir()) == []  # openshell was never called


def test_a_task_with_a_model_endpoint_starts_its_sandbox_without_importing_the_proxy_server(spool):
    """aiohttp (the metering proxy's server) cost about 110 ms of CPU per runner when the runner read
    its endpoints, before the sandbox started: 96 runners starting at once paid it together (issue 15,
    integration overhead 1.17 s median in bench_sandbox's 96-wide run; 0.18 s without it). It is
    imported only when the proxy starts, at the agent's first model request; this agent makes none."""
    from tests.helpers import model_api_policy

    spool.write([{"task": 1}], command=["/bin/true"], policy=model_api_policy(9, os.path.realpath("/bin/true")),
                model_endpoint={"base_url": "http://127.0.0.1:9", "credential_name": "demo"})
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "execution.runner"], env=spool.env(1),
                          cwd=str(spool.root), start_new_session=True, capture_output=True, text=True, timeout=60)
    record = spool.record(1)
    assert proc.returncode == 0, record["error"]
    assert record["stages"]["sandbox_ready_at"] is not None
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "execution.metering.endpoints" in imported  # the endpoints were read and checked
    assert not {m for m in imported if m.split(".")[0] in ("aiohttp", "yarl", "multidict")}
    assert "execution.metering.proxy" not in imported


def test_what_the_runner_writes_is_for_the_submit_account_alone(tmp_path):
    """Defense in depth: the runner's records, logs, request records, work directory, input and
    outputs were 0644/0755, protected only by the spool directory's 0700. Whatever the umask it
    inherits (022 here, Grid Engine's usual), files are 0600 and directories 0700."""
    import stat
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.runner import Spool

    spool = Spool(tmp_path / "spool")
    code = ("import http.client\nc = http.client.HTTPConnection('127.0.0.1', 8790, timeout=30)\n"
            "c.request('POST', '/v1/messages', b'x' * 5000, {'content-type': 'application/json'})\n"
            "print(c.getresponse().status)\nopen('verdict.json', 'w').write('{}')\n")
    policy = ("version: 1\nfilesystem_policy: {include_workdir: true, read_only: [/usr, /lib, /lib64, /bin, /etc], "
              "read_write: [/sandbox, /tmp]}\nnetwork_policies:\n  m:\n    endpoints:\n      - {host: 127.0.0.1, "
              "port: 9, protocol: rest, rules: [{allow: {method: POST, path: /v1/messages}}]}\n"
              "    binaries: [{path: /usr/bin/python3.11}]\n")
    spool.write([{"task": 1}], command=["/usr/bin/python3", "-c", code], policy=policy,
                agent_extra={"outputs": ["verdict.json"]})
    proc = subprocess.run([sys.executable, "-m", "execution.runner"],
                          env={**spool.env(1), "TCO_PROXY_MAX_BODY_BYTES": "1000"}, cwd=str(spool.root),
                          capture_output=True, timeout=60, start_new_session=True,
                          preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    record = spool.record(1)
    assert record["outputs"] and record["requests_path"], record
    written = [Path(p) for p in (spool.record_path(1), record["stdout_path"], record["stderr_path"],
                                 record["requests_path"], record["outputs"][0]["path"])]
    work = spool.root / "work" / "c-1" / "1"
    written += [work / "input.json", work / "verdict.json"]
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for directory in (spool.root / "records", spool.record_path(1).parent, Path(record["outputs"][0]["path"]).parent,
                      spool.root / "work", work.parent, work):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


@pytest.mark.parametrize("case", ["config error", "record unwritable"])
def test_an_unwritable_error_file_does_not_change_the_runners_exit_status(spool, case):
    """Grid Engine's error file of the job is in the spool: when the spool is full the runner's last
    words cannot be written, and its status must still say what happened (78: configuration, 70:
    internal error) rather than Python's 120 for output it could not flush."""
    spool.write([{"task": 1, "duration_s": 0}])
    env = spool.env(1)
    if case == "config error":
        env["TCO_SANDBOX_CPU_S"] = "abc"
    else:
        record_dir = spool.record_path(1).parent
        record_dir.mkdir(parents=True, exist_ok=True)
        spool.record_path(1).mkdir()  # the record's path taken by a directory: the write fails
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        proc = subprocess.run([sys.executable, "-m", "execution.runner"], env=env, cwd=str(spool.root),
                              stdout=subprocess.DEVNULL, stderr=full, timeout=60, start_new_session=True)
    assert proc.returncode == (config.EXIT_CONFIG if case == "config error" else config.EXIT_INTERNAL)
