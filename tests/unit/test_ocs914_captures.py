"""Every file of the OCS 9.1.4 captures (tests/fixtures/ocs914/, real output of an OCS 9.1.4 cell
configured like the dev cluster; see its README.md) read by tco, checked against values read from the raw
files here: the plain-text twin of an XML output (parsed in this file, independently of tco), the
stdlib's ``xml.etree`` on the same XML, or ``qacct``'s own output on the accounting file.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from schedulers.base import AccountingCursor, UnknownJob
from schedulers.gridengine.adapter import GridEngine, OpenClusterScheduler
from schedulers.gridengine.commands import qmod_cleared
from schedulers.gridengine.flavours import flavour_of_banner, flavour_of_files
from schedulers.gridengine.parsers.accounting import read_accounting
from schedulers.gridengine.parsers.qconf import parse_complex_values, parse_qconf_attributes
from schedulers.gridengine.parsers.qhost import parse_qhost
from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.gridengine.parsers.qstat import parse_qstat
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from schedulers.gridengine.parsers.queue_summary import parse_cluster_queue_summary
from schedulers.pending import explain_pending

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ocs914"
UTC = dt.timezone.utc
NEW_YORK = ZoneInfo("America/New_York")


def raw(name: str) -> bytes:
    return (CAPTURES / name).read_bytes()


def test_every_capture_file_is_read_by_a_test_here():
    """A new capture file must get a check: this list is every file, each named in a test below."""
    here = Path(__file__).read_text()
    files = sorted(p.relative_to(CAPTURES).as_posix() for p in CAPTURES.rglob("*") if p.is_file())
    assert len(files) == 74
    globbed = ("qstat_xml_u_all", "qacct_j_")
    missing = [f for f in files if f not in here and not f.startswith(globbed) and f != "README.md"]
    assert missing == []


# ------------------------------------------------------------------ qstat (job listing)

def plain_qstat(text: str) -> dict[tuple[int, int], tuple[str, str | None, int, str]]:
    """``qstat -u '*'`` plain output -> {(job, task or 0): (state, queue@host, slots, "date time")}."""
    rows = {}
    for line in text.splitlines()[2:]:
        tokens = line.split()
        if not tokens:
            continue
        job, _prior, _name, _user, state, date, time, *rest = tokens
        queue = rest.pop(0) if rest and "@" in rest[0] else None
        slots = int(rest.pop(0))
        tasks: list[int] = []
        for part in (rest[0].split(",") if rest else []):
            m = re.fullmatch(r"(\d+)(?:-(\d+):(\d+))?", part)
            first, last, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
            tasks.extend(range(first, last + 1, step))
        for task in tasks or [0]:
            rows[(int(job), task)] = (state, queue, slots, f"{date} {time}")
    return rows


def etree_qstat(data: bytes) -> dict[tuple[int, int], tuple[str, str | None, int]]:
    """The same from the XML with the standard library's parser."""
    rows = {}
    for job in ET.fromstring(data).iter("job_list"):
        queue = job.findtext("queue_name") or None
        tasks: list[int] = []
        for part in (job.findtext("tasks") or "").split(","):
            if part:
                m = re.fullmatch(r"(\d+)(?:-(\d+):(\d+))?", part)
                tasks.extend(range(int(m[1]), int(m[2] or m[1]) + 1, int(m[3] or 1)))
        for task in tasks or [0]:
            rows[(int(job.findtext("JB_job_number")), task)] = (job.findtext("state"), queue,
                                                                 int(job.findtext("slots")))
    return rows


def tco_rows(tasks) -> dict[tuple[int, int], tuple[str, str | None, int]]:
    return {t.key: (t.state_code, f"{t.queue}@{t.host}" if t.queue else None, t.slots) for t in tasks}


# (XML file, its plain-text twin taken at the same moment)
PLAIN_TWINS = [
    ("qstat_xml_u_all.xml", "qstat_u_all.txt"),
    ("qstat_xml_u_all_TZ_America_New_York.xml", "qstat_u_all_TZ_America_New_York.txt"),
    ("qstat_xml_u_all_wave2.xml", "qstat_u_all_wave2.txt"),
    ("qstat_xml_u_all_dr_hr.xml", "qstat_u_all_dr_hr.txt"),
    ("qstat_xml_u_all_restarted.xml", "qstat_u_all_restarted.txt"),
    # The same moment as qstat_u_all.txt, with more columns or another layout.
    *((f"qstat_xml_u_all_{v}.xml", "qstat_u_all.txt") for v in ("ext", "f", "g_d", "pri", "r", "r_ext_urg_pri", "urg")),
]


@pytest.mark.parametrize(("xml_name", "txt_name"), PLAIN_TWINS)
def test_every_qstat_listing_matches_its_plain_text_twin(xml_name, txt_name):
    plain = plain_qstat(raw(txt_name).decode())
    tasks = parse_qstat(raw(xml_name), NEW_YORK if "New_York" in xml_name else UTC)
    assert tco_rows(tasks) == {key: value[:3] for key, value in plain.items()}
    # Times: qstat prints the start (running) or submission (pending) time, to the second, in its TZ.
    zone = NEW_YORK if "New_York" in txt_name else UTC
    for t in tasks:
        if t.started_at is None and t.submitted_at is None:
            assert "ext" in xml_name  # -ext drops the times (as on SGE 8.1.9)
            continue
        when = (t.started_at or t.submitted_at).astimezone(zone).strftime("%Y-%m-%d %H:%M:%S")
        assert when == plain[t.key][3], t.key


@pytest.mark.parametrize("xml_name", ["qstat_xml_u_all_after_qdel.xml", "qstat_xml_u_all_wave3.xml",
                                      "qstat_xml_u_all_empty.xml"])
def test_qstat_listings_without_a_twin_match_the_standard_library_reading(xml_name):
    expected = etree_qstat(raw(xml_name))
    assert tco_rows(parse_qstat(raw(xml_name))) == expected
    assert (len(expected) == 0) == (xml_name == "qstat_xml_u_all_empty.xml")


def test_the_capture_moment_has_the_states_the_readme_describes():
    tasks = {t.key: t for t in parse_qstat(raw("qstat_xml_u_all.xml"))}
    assert (tasks[(3, 5)].state, tasks[(3, 5)].state_code) == ("suspended", "s")  # qmod -sj 3.5
    assert tasks[(5, 0)].state == "error" and tasks[(4, 0)].state == "held"
    dr_hr = {t.key: t.state for t in parse_qstat(raw("qstat_xml_u_all_dr_hr.xml"))}
    assert dr_hr == {(23, 0): "deleting", (24, 0): "running"}  # dr, hr (a hold on a running task)
    restarted = {t.key: t for t in parse_qstat(raw("qstat_xml_u_all_restarted.xml"))}
    assert restarted[(13, 0)].restarted and restarted[(13, 0)].state == "running"  # Rr


def test_the_new_york_listing_is_the_same_instants_as_the_utc_one():
    utc = {t.key: t.started_at or t.submitted_at for t in parse_qstat(raw("qstat_xml_u_all.xml"))}
    ny = {t.key: t.started_at or t.submitted_at
          for t in parse_qstat(raw("qstat_xml_u_all_TZ_America_New_York.xml"), NEW_YORK)}
    assert ny == utc


def test_projects_of_the_ext_listing_are_the_xml_jb_project():
    expected = {int(j.findtext("JB_job_number")): j.findtext("JB_project") or None
                for j in ET.fromstring(raw("qstat_xml_u_all_ext.xml")).iter("job_list")}
    got = {t.job_number: t.project for t in parse_qstat(raw("qstat_xml_u_all_ext.xml"))}
    assert got == expected and got[3] == "research"


# ------------------------------------------------------------------ qstat -j

def plain_job(text: str) -> dict[str, str]:
    """``qstat -j`` plain output -> {label: value} (first line of each label; "scheduling info" joined)."""
    out: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        m = re.match(r"^([a-z_ -]+?):?\s{2,}(\S.*)$", line) if not line.startswith(" ") else None
        if m and not line.startswith("="):
            last = m[1].rstrip(":").strip()
            out.setdefault(last, m[2].strip())
        elif line.startswith(" ") and last == "scheduling info":
            out[last] += "\n" + line.strip()
    return out


@pytest.mark.parametrize(("xml_name", "txt_name"), [
    ("qstat_j_held.xml", "qstat_j_held.txt"),
    ("qstat_j_pending_array.xml", "qstat_j_pending_array.txt"),
    ("qstat_j_running_single.xml", "qstat_j_running_single.txt"),
])
def test_qstat_j_matches_its_plain_text_twin(xml_name, txt_name):
    detail = parse_job_detail(raw(xml_name))
    plain = plain_job(raw(txt_name).decode())
    assert detail["job_number"] == int(plain["job_number"])
    assert detail["name"] == plain["job_name"]
    assert detail["project"] == plain.get("project")
    assert detail["submitted_at"] == dt.datetime.fromisoformat(plain["submission_time"]).replace(tzinfo=UTC)
    # OCS 9 keeps -l in a request set; plain prints it as hard_resource_list.
    expected = dict(item.split("=") for item in plain["hard_resource_list"].split(",")) \
        if "hard_resource_list" in plain else {}
    assert detail["hard_resources"] == expected
    # Every scheduling-info line is either the job's own message or a global one.
    assert sorted(detail["scheduler_messages"] + detail["global_messages"]) == \
        sorted(plain["scheduling info"].split("\n"))


def test_qstat_j_requests_come_from_the_ocs9_request_set():
    held = parse_job_detail(raw("qstat_j_held.xml"))
    assert held["hard_resources"] == {"anthropic_api": "1"}  # hard_resource_list: anthropic_api=1
    assert held["soft_resources"] == {} and held["hard_queues"] == [] and held["scoped_requests"] == {}
    before = parse_job_detail(raw("qstat_j_before_qalter.xml"))  # job 7 before qalter -l anthropic_api=2,h_rt=600
    assert (before["job_number"], before["project"], before["hard_resources"]) == (7, "research",
                                                                                    {"anthropic_api": "1"})
    assert before["holds"] == {"user": [[1, 1, 1]]}  # JB_ja_u_h_ids 1-1


def test_qstat_j_tasks_and_waiting_reasons():
    pending = parse_job_detail(raw("qstat_j_pending_array.xml"))
    assert pending["tasks"] == []  # 1-20:2, none enrolled yet
    reasons = [r["text"] for r in explain_pending(pending, capacities={"anthropic_api": 96})]
    assert reasons[0] == ("waiting for a model API seat: the job asks 1 (-l anthropic_api=1); 96 of 96 in use, 0 free "
                          "(consumable anthropic_api, global)")
    running = parse_job_detail(raw("qstat_j_running_single.xml"))
    assert running["tasks"] == [{"task_number": 1, "state": "running"}]  # job_state 1: r
    held = parse_job_detail(raw("qstat_j_held.xml"))
    assert [r["text"] for r in explain_pending(held)][0] == "held by user (tasks 1)"


def test_qstat_j_of_an_unknown_job_on_ocs914_is_unknown_job():
    with pytest.raises(UnknownJob) as caught:
        parse_job_detail(raw("qstat_j_unknown.xml"))
    assert caught.value.job_ids == ["99999"]


# ------------------------------------------------------------------ queues, hosts, quotas

def test_queue_summary_matches_the_plain_text():
    queues = parse_cluster_queue_summary(raw("qstat_g_c.xml"))
    plain = {}
    for line in raw("qstat_g_c.txt").decode().splitlines()[2:]:
        name, load, used, res, avail, total, *_ = line.split()
        plain[name] = (float(load), int(used), int(res), int(avail), int(total))
    assert {q["name"]: (q["used"], q["resv"], q["available"], q["total"]) for q in queues} == \
        {name: row[1:] for name, row in plain.items()}
    for q in queues:  # plain rounds CQLOAD to 2 decimals (XML 1.15500, plain 1.16)
        assert q["load"] == pytest.approx(plain[q["name"]][0], abs=0.005)


def test_qhost_matches_the_plain_text():
    hosts = {h["name"]: h for h in parse_qhost(raw("qhost_F.xml"))}
    text = raw("qhost_F.txt").decode()
    plain = {}
    current = None
    for line in text.splitlines()[2:]:
        if line.startswith("\t"):
            kind_name, value = line.strip().split("=", 1)
            plain[current]["resources"][kind_name.split(":")[1]] = (kind_name.split(":")[0], value)
        else:
            name, arch, ncpu, *_rest, load = line.split()[:7]
            current = name
            plain[name] = {"arch": None if arch == "-" else arch, "ncpu": None if ncpu == "-" else int(ncpu),
                           "resources": {}}
    assert set(hosts) == set(plain) == {"global", "vm"}
    for name, host in hosts.items():
        assert (host["arch"], host["num_proc"]) == (plain[name]["arch"], plain[name]["ncpu"])
        assert {k: (v["dominance"], v["value"]) for k, v in host["resources"].items()} == plain[name]["resources"]
    assert hosts["vm"]["resources"]["slots"] == {"value": "103", "dominance": "hc"}


def test_qquota_matches_the_plain_text_and_an_idle_cell_has_no_rule():
    assert parse_qquota(raw("qquota_u_all.xml")) == [
        # agent_cap/1        slots=96/96          queues agent.q
        {"rule": "agent_cap/1", "resource": "slots", "limit": 96, "used": 96, "filters": {"queues": ["agent.q"]}}]
    assert "agent_cap/1        slots=96/96          queues agent.q" in raw("qquota_u_all.txt").decode()
    assert parse_qquota(raw("qquota_u_all_idle.xml")) == []


# ------------------------------------------------------------------ accounting

def qacct_records(text: str) -> list[dict[str, str]]:
    """``qacct -j`` output -> one dict per record (first token -> rest, for single-line fields)."""
    records = []
    for block in text.split("==============================================================")[1:]:
        fields = {}
        for line in block.splitlines():
            m = re.match(r"^([a-z_]+)\s{2,}(.*?)\s*$", line)
            if m and m[1] not in fields:
                fields[m[1]] = m[2]
        records.append(fields)
    return records


def all_records():
    batch = read_accounting(CAPTURES / "accounting.jsonl", None, max_bytes=10 * 1024 * 1024)
    assert batch.quarantined == [] and batch.deferred_bytes == 0
    return batch.records


def local(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTURES.glob("qacct_j_*.txt")))
def test_each_qacct_j_record_is_an_accounting_record_with_the_same_values(name):
    expected = qacct_records(raw(name).decode())
    job = int(expected[0]["jobnumber"])
    tasks = {0 if q["taskid"] == "undefined" else int(q["taskid"]) for q in expected}
    mine = {(r.task_number or 0, r.started_at): r for r in all_records()
            if r.job_number == job and (r.task_number or 0) in tasks}
    assert len(mine) == len(expected)
    for q in expected:
        task = 0 if q["taskid"] == "undefined" else int(q["taskid"])
        started = None if q["start_time"] == "-/-" else local(q["start_time"])
        r = mine[(task, started)]
        assert r.queue == q["qname"] and r.hostname == q["hostname"] and r.owner == q["owner"]
        assert (r.project or "NONE") == q["project"]
        assert r.failed == int(q["failed"].split()[0]) and r.exit_status == int(q["exit_status"])
        assert r.wallclock_s == int(q["ru_wallclock"])  # qacct prints (and sums) the integer ru_wallclock
        assert r.wallclock_exact_s == pytest.approx(float(q["wallclock"]), abs=0.0005)  # eusage, 3 decimals
        assert r.cpu_s == pytest.approx(float(q["cpu"]), abs=0.0005)
        assert r.slots == int(q["slots"])
        if q["end_time"] != "-/-":
            assert r.ended_at == local(q["end_time"])


def qacct_table(text: str) -> dict[str, tuple[int, float]]:
    rows = {}
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) in (7, 8) and re.fullmatch(r"\d+", tokens[-7]):  # data rows, not headers or ====
            rows[tokens[0] if len(tokens) == 8 else "total"] = (int(tokens[-7]), float(tokens[-4]))
    return rows


def test_the_sums_of_qacct_p_summary_and_o_are_the_records_sums():
    records = all_records()
    assert len(records) == 253
    by_project: dict[str, list[float]] = {}
    for r in records:
        by_project.setdefault(r.project or "NONE", []).append(r)
    per_project = qacct_table(raw("qacct_P.txt").decode())
    assert per_project == {"NONE": (179, 0.079), "engineering": (350, 0.085), "research": (6086, 18.024)}
    for project, (wall, _cpu) in per_project.items():
        assert sum(r.wallclock_s for r in by_project[project]) == wall
    # (qacct -P's CPU column is UTIME + STIME, the rusage sums; qacct -j's cpu, checked above, is eusage.cpu.)
    assert qacct_table(raw("qacct_summary.txt").decode())["total"][0] == sum(r.wallclock_s for r in records) == 6615
    assert qacct_table(raw("qacct_o.txt").decode())["ocsuser"][0] == 6615


def test_the_exact_wall_clock_is_kept_beside_the_integer_one():
    record = next(r for r in all_records() if r.job_number == 10)
    # qacct_j_10.txt: ru_wallclock 0, wallclock 1.080 (eusage.wallclock 1.08...)
    assert record.wallclock_s == 0 and record.wallclock_exact_s == pytest.approx(1.080, abs=0.0005)


def test_reporting_jsonl_marks_an_ocs9_cell_and_repeats_the_accounting(tmp_path):
    common = tmp_path / "default" / "common"
    common.mkdir(parents=True)
    (common / "reporting.jsonl").write_bytes(raw("reporting.jsonl"))
    assert flavour_of_files(str(tmp_path), "default").flavour == "ocs9"
    acct = [json.loads(line) for line in raw("reporting.jsonl").splitlines() if b'"type":"acct"' in line]
    accounted = {(r.job_number, r.task_number or 0) for r in all_records()}
    assert len(acct) == 247 and {(a["job_number"], a["task_number"]) for a in acct} <= accounted


def test_the_accounting_cursor_resumes_after_the_last_whole_record():
    first = read_accounting(CAPTURES / "accounting.jsonl", None, max_bytes=100_000)
    rest = read_accounting(CAPTURES / "accounting.jsonl", first.cursor, max_bytes=10 * 1024 * 1024)
    assert len(first.records) + len(rest.records) == 253
    assert isinstance(rest.cursor, AccountingCursor) and rest.cursor.offset == (CAPTURES / "accounting.jsonl").stat().st_size


# ------------------------------------------------------------------ version, control messages, configuration

def test_the_version_banner_says_ocs9():
    assert raw("version.txt").decode().strip() == "OCS 9.1.4"
    assert flavour_of_banner(raw("version.txt").decode()) == "ocs9"


@pytest.mark.parametrize(("name", "argv"), [
    ("qalter.txt", ["qalter", "-p", "0", "7"]),
    ("qmod_rj.txt", ["qmod", "-rj", "13"]),
    ("qmod_sj.txt", ["qmod", "-sj", "3.5"]),
])
def test_control_output_of_ocs914_is_success(monkeypatch, name, argv):
    """qalter/qmod print their confirmation on stdout and exit 0; the adapter passes it through."""
    seen = []

    def fake_run(self, run_argv, timeout=None):
        seen.append(run_argv)
        return raw(name)

    monkeypatch.setattr(GridEngine, "_run", fake_run)
    engine = OpenClusterScheduler(json=False)
    assert engine._run(argv) == raw(name)
    assert not qmod_cleared(raw(name).decode())  # not a "cleared error state" answer
    assert argv[-1] in raw(name).decode().split()  # names the job (task) it acted on


def test_the_global_host_configuration_gives_the_seat_capacity():
    assert parse_complex_values(raw("config/qconf_se_global.txt")) == {"anthropic_api": 96.0}
    assert parse_complex_values(raw("config/qconf_se_vm.txt"))["slots"] == 200.0


def conf(name: str) -> dict[str, str]:
    return parse_qconf_attributes(raw(name))


def test_the_cell_configuration_as_qconf_printed_it():
    """config/: the settings tco_doctor and docs/gridengine.md rely on, read as tco reads them."""
    assert conf("config/qconf_ssconf.txt")["schedd_job_info"] == "true"
    assert conf("config/qconf_ssconf.txt")["schedule_interval"] == "0:0:1"
    global_conf = conf("config/qconf_sconf_global.txt")
    assert global_conf["reporting_params"].split()[:2] == ["accounting=true", "reporting=true"]
    assert global_conf["execd_params"] == "NOTIFY_KILL=TERM,NOTIFY_SUSP=none"
    bootstrap = conf("config/bootstrap.txt")
    assert (bootstrap["admin_user"], bootstrap["spooling_method"]) == ("ocsadmin", "classic")
    agent = conf("config/qconf_sq_agent.q.txt")
    assert (agent["qname"], agent["slots"], agent["projects"]) == ("agent.q", "96", "research engineering")
    classic = conf("config/qconf_sq_classic.q.txt")
    assert (classic["qname"], classic["slots"]) == ("classic.q", "2")
    assert conf("config/qconf_sprj_research.txt")["name"] == "research"
    assert conf("config/qconf_sprj_engineering.txt")["name"] == "engineering"
    complexes = raw("config/qconf_sc.txt").decode().splitlines()
    assert [line.split()[:6] for line in complexes if line.startswith("anthropic_api")] == [
        ["anthropic_api", "api", "INT", "<=", "YES", "YES"]]
    rqs = conf("config/qconf_srqs.txt")
    assert (rqs["name"], rqs["limit"]) == ("agent_cap", "queues agent.q to slots=96")
