"""OCS 9 as a flavour: detection and defaults, the qstat -j reader on OCS 9.2 output, -fmt json readers,
the adapter's JSON/XML choice, DRMAA library and closing, ingest of the captured OCS 9.1.4 accounting.

Fixtures: tests/fixtures/ocs914/ (real OCS 9.1.4 output), tests/fixtures/ocs920/ (real OCS 9.2.0prealpha
output, a subset of the captures; its README.md describes every file). Where a test edits a captured file
to make a case the capture lacks, it says so ("derived from").
"""
from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path

import pytest

from schedulers import registry
from schedulers.base import SchedulerAdapter, SchedulerCommandError, UnknownJob, abstract_methods
from schedulers.gridengine import drmaa as drmaa_module
from schedulers.gridengine import flavours
from schedulers.gridengine.adapter import GridEngine, OpenClusterScheduler
from schedulers.gridengine.parsers.ocs_json import (parse_qhost_json, parse_qquota_json, parse_qstat_json,
                                                    parse_queue_summary_json)
from schedulers.gridengine.parsers.qhost import parse_qhost
from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.gridengine.parsers.qstat import parse_qstat
from schedulers.gridengine.parsers.qstat_j import parse_job_detail, task_state
from schedulers.gridengine.parsers.queue_summary import parse_cluster_queue_summary
from schedulers.pending import explain_pending

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OCS914 = FIXTURES / "ocs914"
OCS920 = FIXTURES / "ocs920"

#: The lifecycle word of each qstat state code in these captures, written out by hand from qstat(1).
BY_HAND = {"r": "running", "s": "suspended", "Eqw": "error", "qw": "pending", "hqw": "held", "df": "finishing"}


def plain_task_states(text: str) -> dict[int, str]:
    """``job_state   N: code`` lines of a plain ``qstat -j`` -> {task: code}."""
    return {int(m[1]): m[2] for m in re.finditer(r"^job_state\s+(\d+):\s+(\S+)", text, re.M)}


# ------------------------------------------------------------------ flavour and defaults

@pytest.mark.parametrize(("banner", "flavour"), [
    ("SGE 8.1.9", "sge8"), ("OCS 9.1.4", "ocs9"), ("GCS 9.1.7", "ocs9"), ("OCS 9.2.0prealpha", "ocs9"),
    ("usage: qstat [options]", None), ("", None), ("OCS 10.0.0", "ocs9"), ("SGE 6.2u5", None),
])
def test_the_version_banner_names_the_flavour(banner, flavour):
    assert flavours.flavour_of_banner(banner) == flavour


def test_the_captured_banners_and_help_texts():
    assert flavours.flavour_of_banner((OCS914 / "version.txt").read_text()) == "ocs9"
    help_text = (OCS920 / "qstat_help.txt").read_text()
    assert flavours.flavour_of_banner(help_text.splitlines()[0]) == "ocs9"
    assert flavours.version_tuple(help_text.splitlines()[0]) == (9, 2, 0) and "-fmt" in help_text


def test_each_flavour_has_its_files_library_and_preload():
    sge8, ocs9 = flavours.defaults_for("sge8"), flavours.defaults_for("ocs9")
    assert sge8.accounting_path("/opt/sge", "default") == "/opt/sge/default/common/accounting"
    assert ocs9.accounting_path("/opt/sge", "default") == "/opt/sge/default/common/accounting.jsonl"
    assert (sge8.accounting_format, ocs9.accounting_format) == ("colon", "json")
    assert ocs9.reporting_path("/opt/sge", "c") == "/opt/sge/c/common/reporting.jsonl"
    assert ocs9.drmaa_library_candidates("/opt/sge") == ["/opt/sge/lib/lx-amd64/libdrmaa.so"]
    assert sge8.drmaa_library_candidates("/opt/sge") == ["/opt/sge/lib/lx-amd64/libdrmaa.so.1.0",
                                                         flavours.DEBIAN_DRMAA_LIBRARY]
    assert sge8.jemalloc_preload == flavours.JEMALLOC_PRELOAD and ocs9.jemalloc_preload is None
    with pytest.raises(KeyError, match="sge8, ocs9"):
        flavours.defaults_for("pbs")


def cell(tmp_path: Path, *names: str) -> str:
    common = tmp_path / "default" / "common"
    common.mkdir(parents=True)
    for name in names:
        (common / name).write_bytes(b"")
    return str(tmp_path)


def test_detection_prefers_the_banner_then_the_files(tmp_path):
    root = cell(tmp_path, "accounting.jsonl")

    def banner(text):
        return lambda argv, **kw: text.encode()

    def unreachable(argv, **kw):
        from schedulers.base import SchedulerUnavailable
        raise SchedulerUnavailable("qstat: command not found")

    assert flavours.detect_flavour(root, "default", run=banner("SGE 8.1.9\nusage: qstat")).flavour == "sge8"
    found = flavours.detect_flavour(root, "default", run=unreachable)
    assert found.flavour == "ocs9" and "accounting.jsonl" in found.evidence
    assert flavours.detect_flavour(cell(tmp_path / "b", "accounting"), "default", run=unreachable).flavour == "sge8"
    with pytest.raises(flavours.UnknownInstallation, match="TCO_SCHEDULER_FLAVOUR"):
        flavours.detect_flavour(cell(tmp_path / "c"), "default", run=unreachable)


def test_the_registry_has_both_flavours_and_both_adapters_are_complete():
    assert {"sge8", "ocs9"} <= set(registry.flavours())
    ocs = registry.create("ocs9", sge_root="/opt/sge", sge_cell="default", json=False)
    assert type(ocs) is OpenClusterScheduler and ocs.flavour == "ocs9"
    assert ocs.accounting_path == "/opt/sge/default/common/accounting.jsonl"
    assert GridEngine(sge_root="/opt/sge").accounting_path == "/opt/sge/default/common/accounting"
    assert issubclass(OpenClusterScheduler, SchedulerAdapter) and abstract_methods(OpenClusterScheduler) == set()


# ------------------------------------------------------------------ qstat -j on OCS 9.2 output

def test_an_error_task_is_in_error_with_its_reason_even_without_scheduler_messages():
    data = (OCS920 / "qstat_j_error.xml").read_bytes()
    plain = (OCS920 / "qstat_j_error.txt").read_text()
    detail = parse_job_detail(data)
    assert {t["task_number"]: t["state"] for t in detail["tasks"]} == \
        {n: BY_HAND[code] for n, code in plain_task_states(plain).items()}  # 1: Eqw (JAT_state 34880, status 0)
    reason = re.search(r"^error_reason\s+1: (.*)$", plain, re.M)[1]
    assert detail["errors"] == [{"task_number": 1, "message": reason}]
    expected = ("in error state: can't chdir to /nonexistent/dir: No such file or directory; fix the cause, "
                "then clear it with qmod -cj 5 (or delete it)")
    assert explain_pending(detail)[0]["text"] == expected
    # Derived from the capture: schedd_job_info false drops the <messages> block; the reason stays.
    quiet = re.sub(rb"<messages>.*</messages>", b"", data, flags=re.S)
    detail = parse_job_detail(quiet)
    assert detail["scheduler_messages"] == [] and explain_pending(detail)[0]["text"] == expected


def test_every_task_state_of_a_running_array_is_the_one_qstat_prints():
    detail = parse_job_detail((OCS920 / "qstat_j_array_running_pending.xml").read_bytes())
    plain = plain_task_states((OCS920 / "qstat_j_array_running_pending.txt").read_text())
    assert len(plain) == 96 and plain[5] == "s"  # task 3.5 suspended with qmod -sj
    assert {t["task_number"]: t["state"] for t in detail["tasks"]} == {n: BY_HAND[c] for n, c in plain.items()}


def test_a_task_deleted_while_running():
    data = (OCS920 / "qstat_j_finished_deleted.xml").read_bytes()
    plain = plain_task_states((OCS920 / "qstat_j_finished_deleted.txt").read_text())
    assert plain == {1: "df"}  # retained: deleted, finished (JAT_state 1152, JAT_status 65536)
    assert parse_job_detail(data)["tasks"] == [{"task_number": 1, "state": "finishing"}]
    # Derived: the same task before it finished (JAT_status running) is dr, "deleting" (not "running").
    running = data.replace(b"<JAT_status>65536</JAT_status>", b"<JAT_status>128</JAT_status>")
    assert parse_job_detail(running)["tasks"] == [{"task_number": 1, "state": "deleting"}]


@pytest.mark.parametrize(("word", "status", "hold", "state"), [
    (0x8840, 0, 0, "error"), (0x100, 0x80, 0, "suspended"), (0x480, 0x80, 0, "deleting"),
    (0x10080, 0x80, 0, "suspended"), (0x80, 0x80, 1, "running"), (0x40, 0x40, 1, "held"),
    (None, 0x80, 0, "running"), (0x80, 0x10000, 0, "finishing"),
])
def test_the_state_word_has_the_queue_listings_precedence(word, status, hold, state):
    assert task_state(word, status, hold) == state


def test_soft_and_scoped_requests_from_a_request_set():
    """Derived from qstat_j_held.xml (OCS 9.1.4): a soft request, queues and a master-scope set added,
    element names from OCS 9's JRS (hard/soft resource and queue lists, JRS_scope 1 = master)."""
    data = (OCS914 / "qstat_j_held.xml").read_bytes()
    soft = (b"<JRS_soft_resource_list><element><CE_name>h_rt</CE_name><CE_stringval>600</CE_stringval>"
            b"</element></JRS_soft_resource_list><JRS_hard_queue_list><element><QR_name>agent.q</QR_name>"
            b"</element></JRS_hard_queue_list><JRS_soft_queue_list><element><QR_name>classic.q</QR_name>"
            b"</element></JRS_soft_queue_list>")
    data = data.replace(b"</JRS_hard_resource_list>", b"</JRS_hard_resource_list>" + soft, 1)
    master = (b"<element><JRS_scope>1</JRS_scope><JRS_hard_resource_list><element><CE_name>h_vmem</CE_name>"
              b"<CE_stringval>2G</CE_stringval></element></JRS_hard_resource_list></element>")
    data = data.replace(b"</JB_request_set_list>", master + b"</JB_request_set_list>", 1)
    detail = parse_job_detail(data)
    assert detail["hard_resources"] == {"anthropic_api": "1"} and detail["soft_resources"] == {"h_rt": "600"}
    assert (detail["hard_queues"], detail["soft_queues"]) == (["agent.q"], ["classic.q"])
    assert detail["scoped_requests"] == {"master": {"hard_resources": {"h_vmem": "2G"}, "soft_resources": {},
                                                    "hard_queues": [], "soft_queues": []}}


# ------------------------------------------------------------------ -fmt json (captured OCS 9.2.0prealpha)

def read(name: str) -> bytes:
    return (OCS920 / name).read_bytes()


def test_qstat_json_gives_the_tasks_the_xml_gives():
    """Captured: qstat_json_u_all.json and qstat_xml_u_all.xml, the same moment."""
    from_json = {t.key: t for t in parse_qstat_json(read("qstat_json_u_all.json"))}
    from_xml = {t.key: t for t in parse_qstat(read("qstat_xml_u_all.xml"))}
    assert len(from_json) == 214 and from_json.keys() == from_xml.keys()
    for key, t in from_json.items():
        x = from_xml[key]
        # JSON has milliseconds (…:37.945Z), the XML microseconds (…:37.945406).
        assert abs(((t.started_at or t.submitted_at) - (x.started_at or x.submitted_at)).total_seconds()) < 0.001
        assert dataclasses.replace(t, started_at=None, submitted_at=None) == \
            dataclasses.replace(x, started_at=None, submitted_at=None)
    assert from_json[(3, 5)].state == "suspended" and from_json[(5, 0)].state == "error"


def test_qstat_json_ext_has_the_projects():
    """Captured: qstat -fmt json -ext, like -xml -ext, has the project and no times."""
    projects = {t.job_number: t.project for t in parse_qstat_json(read("qstat_json_u_all_ext.json"))}
    assert projects == {t.job_number: t.project for t in parse_qstat(read("qstat_xml_u_all_ext.xml"))}
    assert projects[3] == "research"


def test_queue_summary_qhost_and_qquota_json_match_the_xml():
    """Captured: qstat -g c, qhost -F and qquota, each as -fmt json and -xml at the same moment."""
    assert parse_queue_summary_json(read("qstat_g_c.json")) == parse_cluster_queue_summary(read("qstat_g_c.xml"))
    assert parse_qquota_json(read("qquota_u_all.json")) == parse_qquota(read("qquota_u_all.xml"))
    assert parse_qquota_json(read("qquota_json_u_all_idle.json")) == parse_qquota(read("qquota_u_all_idle.xml")) == []
    from_json, from_xml = parse_qhost_json(read("qhost_F.json")), parse_qhost(read("qhost_F.xml"))
    for j, x in zip(from_json, from_xml):
        assert j["resources"] == x["resources"] and (j["name"], j["arch"], j["num_proc"], j["load_avg"]) == \
            (x["name"], x["arch"], x["num_proc"], x["load_avg"])
    vm = from_json[1]
    # JSON memory is exact bytes (hl:mem_total=25276510208); the XML hostvalue is rounded ("23.5G").
    assert vm["mem_total_bytes"] == int(vm["resources"]["mem_total"]["value"]) == 25276510208
    assert from_json[0]["num_proc"] is None  # the global host: 0 in JSON, "-" in XML


def fake_cell(monkeypatch, answers: dict[str, bytes | Exception]) -> list[list[str]]:
    """GridEngine._run answered from captured files by argv; returns the argvs run."""
    seen: list[list[str]] = []

    def run(self, argv, timeout=None):
        seen.append(argv)
        answer = answers[" ".join(argv)]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(GridEngine, "_run", run)
    monkeypatch.setattr("schedulers.gridengine.adapter._JSON_CLIENTS", {})
    monkeypatch.setattr("schedulers.gridengine.adapter._PROJECTS", {})
    return seen


def test_an_ocs92_cell_is_read_as_json_and_an_ocs91_cell_as_xml(monkeypatch):
    answers = {
        "qstat -help": read("qstat_help.txt"),
        "qstat -fmt json -u *": read("qstat_json_u_all.json"),
        "qstat -fmt json -ext -u *": read("qstat_json_u_all_ext.json"),
        "qstat -g c -fmt json": read("qstat_g_c.json"),
        "qstat -xml -u *": (OCS914 / "qstat_xml_u_all.xml").read_bytes(),
        "qstat -xml -ext -u *": (OCS914 / "qstat_xml_u_all_ext.xml").read_bytes(),
    }
    seen = fake_cell(monkeypatch, answers)
    engine = OpenClusterScheduler(sge_root="/opt/sge", sge_cell="ocs92")
    tasks = engine.list_tasks()
    assert seen == [["qstat", "-help"], ["qstat", "-fmt", "json", "-u", "*"], ["qstat", "-fmt", "json", "-ext", "-u", "*"]]
    assert len(tasks) == 214 and {t.project for t in tasks if t.job_number == 3} == {"research"}
    assert engine.queue_summary()[0]["name"] == "agent.q"

    answers["qstat -help"] = (OCS914 / "version.txt").read_bytes() + b"usage: qstat [options]\n"
    seen = fake_cell(monkeypatch, answers)
    tasks = OpenClusterScheduler(sge_root="/opt/sge", sge_cell="ocs91").list_tasks()
    assert seen[1:] == [["qstat", "-xml", "-u", "*"], ["qstat", "-xml", "-ext", "-u", "*"]]
    assert len(tasks) == 202


def test_json_refused_by_the_clients_falls_back_to_xml(monkeypatch):
    seen = fake_cell(monkeypatch, {
        "qstat -g c -fmt json": SchedulerCommandError("qstat: invalid option -fmt", argv=["qstat"], returncode=1,
                                                      stderr="error: unknown option -fmt"),
        "qstat -g c -xml": read("qstat_g_c.xml"),
    })
    queues = OpenClusterScheduler(json=True).queue_summary()
    assert [q["name"] for q in queues] == ["agent.q", "classic.q"] and seen[-1] == ["qstat", "-g", "c", "-xml"]


def test_qstat_j_of_an_unknown_job_on_ocs92_is_unknown_job(monkeypatch):
    stderr = (OCS920 / "qstat_j_unknown_xml_with_stderr.txt").read_text().splitlines()[0]
    fake_cell(monkeypatch, {"qstat -j 99999 -xml": SchedulerCommandError("qstat exited with status 1",
                                                                         argv=["qstat"], returncode=1, stderr=stderr)})
    with pytest.raises(UnknownJob) as caught:
        OpenClusterScheduler(json=False).job_detail(99999)
    assert caught.value.job_ids == ["99999"]


def test_the_sge8_adapter_never_asks_for_json(monkeypatch):
    seen = fake_cell(monkeypatch, {"qquota -u * -xml": read("qquota_u_all.xml")})
    assert GridEngine().quotas()[0]["rule"] == "agent_cap/1" and seen == [["qquota", "-u", "*", "-xml"]]


# ------------------------------------------------------------------ DRMAA

def test_the_library_follows_the_flavour_unless_the_environment_names_one(monkeypatch, tmp_path):
    monkeypatch.delenv("DRMAA_LIBRARY_PATH", raising=False)
    assert drmaa_module.library_path("ocs9", "/opt/sge") == "/opt/sge/lib/lx-amd64/libdrmaa.so"
    lib = tmp_path / "lib" / "lx-amd64"
    lib.mkdir(parents=True)
    (lib / "libdrmaa.so.1.0").write_bytes(b"")
    assert drmaa_module.library_path("sge8", str(tmp_path)) == str(lib / "libdrmaa.so.1.0")
    monkeypatch.setenv("DRMAA_LIBRARY_PATH", "/elsewhere/libdrmaa.so")
    assert drmaa_module.library_path("ocs9", "/opt/sge") == "/elsewhere/libdrmaa.so"


class BlockingSession:
    """A DRMAA session whose drmaa_exit blocks, as OCS 9's does for a non-manager (SGE_JAPI_EDTIME)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exited = threading.Event()

    def exit(self) -> None:
        self.release.wait(60)
        self.exited.set()


def test_closing_does_not_wait_for_a_qmaster_that_refuses_the_shutdown(monkeypatch):
    session = BlockingSession()
    monkeypatch.setattr(drmaa_module, "_session", session)
    monkeypatch.setattr(drmaa_module, "_session_pid", __import__("os").getpid())
    assert drmaa_module.close_session(timeout=0.05) is False  # went on without drmaa_exit
    assert drmaa_module._session is None and not session.exited.is_set()
    session.release.set()
    assert session.exited.wait(5)
    assert drmaa_module.close_session() is True  # nothing open: nothing to wait for


def test_opening_a_session_sets_a_short_event_delivery_interval(monkeypatch):
    class FakeSession:
        contact = "fake"

        def initialize(self):
            pass

    class FakeDrmaa:
        errors = type("errors", (), {"AlreadyActiveSessionException": RuntimeError,
                                     "DrmaaException": RuntimeError})
        Session = FakeSession

    monkeypatch.delenv("SGE_JAPI_EDTIME", raising=False)
    monkeypatch.delenv("SGE_JAPI_FLUSH_DELAY_RATE", raising=False)
    monkeypatch.setattr(drmaa_module, "load_drmaa", lambda *a, **k: FakeDrmaa)
    monkeypatch.setattr(drmaa_module, "_session", None)
    monkeypatch.setattr(drmaa_module, "_atexit_registered", True)
    drmaa_module.open_session(flavour="ocs9")
    try:
        environ = __import__("os").environ
        assert environ["SGE_JAPI_EDTIME"] == str(drmaa_module.JAPI_EDTIME_S)
        # libdrmaa refuses a flush delay longer than the delivery time (its default is 6 s).
        assert 0 < int(environ["SGE_JAPI_FLUSH_DELAY_RATE"]) < int(environ["SGE_JAPI_EDTIME"])
    finally:
        monkeypatch.setattr(drmaa_module, "_session", None)


# ------------------------------------------------------------------ accounting of an ocs9 cluster
