"""qstat/qhost/qquota XML parsers: case files, OCS 9 shapes, and the traps."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from schedulers.base import QstatTask, SchedulerParseError, UnknownJob
from schedulers.gridengine.parsers import qstat as qstat_xml
from schedulers.gridengine.parsers.qhost import parse_memory, parse_qhost
from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.base import diff_tasks
from schedulers.gridengine.parsers.qstat import expand_task_ranges, parse_qstat
from schedulers.gridengine.parsers.qstat_j import job_status_state, parse_job_detail
from schedulers.gridengine.parsers.queue_summary import parse_cluster_queue_summary

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = FIXTURES / "cases"
OCS9 = FIXTURES / "ocs9"
UTC = dt.timezone.utc


def utc(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def by_key(tasks: list[QstatTask]) -> dict[tuple[int, int], QstatTask]:
    return {t.key: t for t in tasks}


def job_list(number, state, *, name="agent", owner="tco", time_tag="JB_submission_time",
             time="2025-03-10T09:00:00", queue="", slots=1, tasks=None, extra="") -> str:
    tasks_el = f"\n      <tasks>{tasks}</tasks>" if tasks is not None else ""
    kind = "running" if queue else "pending"
    return f"""    <job_list state="{kind}">
      <JB_job_number>{number}</JB_job_number>
      <JAT_prio>0.50000</JAT_prio>
      <JB_name>{name}</JB_name>
      <JB_owner>{owner}</JB_owner>{extra}
      <state>{state}</state>
      <{time_tag}>{time}</{time_tag}>
      <queue_name>{queue}</queue_name>
      <slots>{slots}</slots>{tasks_el}
    </job_list>
"""


def qstat_doc(running: str = "", pending: str = "") -> str:
    return ("<?xml version='1.0'?>\n<job_info  xmlns:xsd=\"http://arc.liv.ac.uk/repos/darcs/sge/source/dist/"
            "util/resources/schemas/qstat/qstat.xsd\">\n  <queue_info>\n" + running
            + "  </queue_info>\n  <job_info>\n" + pending + "  </job_info>\n</job_info>\n")


def both_paths(data: bytes, tz=UTC) -> tuple[list[QstatTask], list[QstatTask]]:
    """The tasks from the regex fast path and from the lxml tree walk."""
    fast_rows = qstat_xml._fast_job_rows(data)
    assert fast_rows is not None, "the fast path should accept this document"
    return (qstat_xml._tasks_from_rows(fast_rows, tz),
            qstat_xml._tasks_from_rows(qstat_xml._lxml_job_rows(data), tz))


# --------------------------------------------------------------------- BUG-01

def test_bug01_array_tasks_match_expected_json():
    data = (CASES / "BUG-01_array_tasks" / "qstat.xml").read_bytes()
    expected = json.loads((CASES / "BUG-01_array_tasks" / "expected.json").read_text())
    tasks = parse_qstat(data)

    assert data.count(b"<job_list") == expected["rows_in_xml"]
    assert len({t.job_number for t in tasks}) == expected["distinct_jobs"]
    for job, want in expected["jobs"].items():
        mine = [t for t in tasks if t.job_number == int(job)]
        running = sorted(t.task_number for t in mine if t.state == "running")
        pending = [t for t in mine if t.state == "pending"]
        assert running == want["running_tasks"]
        assert sum(t.slots for t in pending) == want["pending_slots"]
        if want["is_array"]:
            assert sorted(t.task_number for t in pending) == want["pending_tasks"]
            assert len(mine) == want["total_tasks_visible"]
            assert {t.slots for t in mine} == {want["slots_per_task"]}
        else:
            assert [t.task_number for t in mine] == [None]
        if "running_slots" in want:
            assert sum(t.slots for t in mine if t.state == "running") == want["running_slots"]
        for host, numbers in want.get("hosts", {}).items():
            assert sorted(t.task_number for t in mine if t.host == host) == numbers


def test_bug01_running_array_tasks_are_one_row_each_with_their_host():
    tasks = by_key(parse_qstat((CASES / "BUG-01_array_tasks" / "qstat.xml").read_bytes()))
    assert tasks[(2002, 1)].host == "node01.example.org"
    assert tasks[(2002, 2)].host == "node02.example.org"
    assert tasks[(2002, 3)].started_at == utc(2025, 3, 10, 9, 1, 40)
    assert tasks[(2002, 1)].queue == "all.q"
    assert tasks[(2002, 1)].submitted_at is None


def test_bug01_pending_range_and_step_list_expand_to_one_task_each():
    tasks = by_key(parse_qstat((CASES / "BUG-01_array_tasks" / "qstat.xml").read_bytes()))
    assert [n for (job, n) in tasks if job == 2002] == list(range(1, 11))
    assert [n for (job, n) in tasks if job == 2003] == [2, 5, 7, 9]
    assert tasks[(2003, 5)].submitted_at == utc(2025, 3, 10, 9, 10, 0)
    assert tasks[(2003, 5)].queue is None and tasks[(2003, 5)].host is None


def test_bug01_a_job_without_tasks_element_is_not_an_array():
    tasks = [t for t in parse_qstat((CASES / "BUG-01_array_tasks" / "qstat.xml").read_bytes())
             if t.job_number == 2004]
    assert len(tasks) == 1
    assert tasks[0].task_number is None
    assert tasks[0].key == (2004, 0)
    assert tasks[0].slots == 4


# --------------------------------------------------------------------- BUG-02

def test_bug02_compound_states_match_expected_json():
    data = (CASES / "BUG-02_compound_states" / "qstat.xml").read_bytes()
    expected = json.loads((CASES / "BUG-02_compound_states" / "expected.json").read_text())
    tasks = {t.job_number: t for t in parse_qstat(data)}
    assert set(tasks) == {int(job) for job in expected["jobs"]}
    for job, want in expected["jobs"].items():
        assert (tasks[int(job)].state, tasks[int(job)].restarted) == (want["category"], want["restarted"]), job


def test_bug02_key_states_written_out():
    tasks = {t.job_number: t for t in parse_qstat((CASES / "BUG-02_compound_states" / "qstat.xml").read_bytes())}
    assert (tasks[4111].state_code, tasks[4111].state) == ("Eqw", "error")
    assert (tasks[4110].state, tasks[4110].restarted) == ("held", True)
    assert (tasks[4107].state, tasks[4103].state, tasks[4103].restarted) == ("deleting", "running", True)
    assert tasks[4106].state == "suspended"


# ----------------------------------------------------------- ranges, parsing

@pytest.mark.parametrize(
    ("spec", "numbers"),
    [("7", [7]), ("4-10:1", [4, 5, 6, 7, 8, 9, 10]), ("1-10:3", [1, 4, 7, 10]), ("2,5-9:2", [2, 5, 7, 9]),
     ("1-3", [1, 2, 3]), ("5-5:2", [5]), ("1,3", [1, 3])],
)
def test_task_specs_expand(spec, numbers):
    assert expand_task_ranges(spec) == numbers


@pytest.mark.parametrize("spec", ["", "a", "3-1", "0", "1-", "1-5:0", "1-5:x", "1;2", "-3"])
def test_malformed_task_specs_raise_parse_error(spec):
    with pytest.raises(SchedulerParseError):
        expand_task_ranges(spec)


def test_a_pending_array_of_99900_tasks_becomes_99900_tasks_with_distinct_keys():
    running = "".join(job_list(900, "r", time_tag="JAT_start_time", queue=f"agent.q@node{i % 4}", tasks=i)
                      for i in range(1, 101))
    pending = job_list(900, "qw", tasks="101-100000:1")
    tasks = parse_qstat(qstat_doc(running, pending).encode())
    assert len(tasks) == 100_000
    assert len({t.key for t in tasks}) == 100_000
    assert tasks[-1].task_number == 100_000 and tasks[-1].state == "pending"


def test_times_without_zone_are_read_in_the_cluster_zone_and_returned_as_utc():
    data = (CASES / "BUG-01_array_tasks" / "qstat.xml").read_bytes()
    berlin = by_key(parse_qstat(data, ZoneInfo("Europe/Berlin")))
    assert berlin[(2002, 1)].started_at == utc(2025, 3, 10, 8, 0, 5)  # CET = UTC+1
    assert berlin[(2002, 1)].started_at.tzinfo == UTC
    summer = qstat_doc(pending=job_list(1, "qw", time="2025-07-01T12:00:00"))
    assert parse_qstat(summer.encode(), ZoneInfo("America/New_York"))[0].submitted_at == utc(2025, 7, 1, 16, 0, 0)


def test_ocs9_microseconds_and_jat_submission_time_are_kept():
    tasks = by_key(parse_qstat((OCS9 / "qstat.xml").read_bytes()))
    assert tasks[(5101, 1)].started_at == utc(2026, 3, 2, 14, 5, 1, 123456)
    assert tasks[(5101, 2)].started_at == utc(2026, 3, 2, 14, 5, 31, 654321)
    assert tasks[(5101, 20)].submitted_at == utc(2026, 3, 2, 14, 4, 59, 500000)
    assert tasks[(5102, 0)].submitted_at == utc(2026, 3, 2, 14, 6, 12)
    assert (tasks[(5101, 2)].state_code, tasks[(5101, 2)].state) == ("hr", "running")
    assert tasks[(5102, 0)].state == "held"
    assert len(tasks) == 21


def test_non_utf8_bytes_and_control_characters_in_job_names_do_not_fail_the_poll():
    pending = (job_list(1, "qw", name="caf\xe9") + job_list(2, "qw", name="bell\x07tab\tend")
               + job_list(3, "qw", name="ok"))
    data = qstat_doc(pending=pending).encode("utf-8").replace("caf\xe9".encode("utf-8"), b"caf\xe9\xff")
    assert b"caf\xe9\xff" in data
    tasks = {t.job_number: t for t in parse_qstat(data)}
    assert tasks[1].name == "caf\ufffd\ufffd"
    assert tasks[2].name == "bell\ufffdtab\tend"
    assert tasks[3].name == "ok"


def test_fast_path_and_lxml_path_agree_on_non_utf8_and_control_characters():
    pending = job_list(1, "qw", name="caf\xe9\x01x") + job_list(2, "qw", name="a &amp; b &lt; c")
    data = qstat_doc(pending=pending).encode("latin-1")
    fast, tree = both_paths(data)
    assert fast == tree
    assert [t.name for t in fast] == ["caf\ufffd\ufffdx", "a & b < c"]


@pytest.mark.parametrize("path", [CASES / "BUG-01_array_tasks" / "qstat.xml",
                                  CASES / "BUG-02_compound_states" / "qstat.xml", OCS9 / "qstat.xml"])
def test_fast_path_and_lxml_path_give_the_same_tasks(path):
    fast, tree = both_paths(path.read_bytes(), ZoneInfo("Europe/Berlin"))
    assert fast == tree and len(fast) > 0


def test_ext_output_is_parsed_by_the_tree_path_with_its_project():
    extra = "\n      <JB_project>research</JB_project>\n      <JB_department>defaultdepartment</JB_department>"
    data = qstat_doc(pending=job_list(7, "qw", extra=extra, tasks="1-2")).encode()
    assert qstat_xml._fast_job_rows(data) is None
    tasks = parse_qstat(data)
    assert [(t.task_number, t.project) for t in tasks] == [(1, "research"), (2, "research")]


def test_full_listing_takes_the_queue_from_the_queue_list():
    data = b"""<?xml version='1.0'?>
<job_info>
  <queue_info>
    <Queue-List>
      <name>agent.q@node01</name>
      <qtype>BIP</qtype>
      <slots_used>1</slots_used>
      <slots_resv>0</slots_resv>
      <slots_total>4</slots_total>
      <arch>lx-amd64</arch>
      <state>a</state>
      <job_list state="running">
        <JB_job_number>8</JB_job_number>
        <JAT_prio>0.50000</JAT_prio>
        <JB_name>x</JB_name>
        <JB_owner>tco</JB_owner>
        <state>r</state>
        <JAT_start_time>2025-03-10T10:00:00</JAT_start_time>
        <slots>1</slots>
      </job_list>
    </Queue-List>
  </queue_info>
  <job_info>
  </job_info>
</job_info>
"""
    assert qstat_xml._fast_job_rows(data) is None
    (task,) = parse_qstat(data)
    assert (task.queue, task.host, task.state_code, task.state) == ("agent.q", "node01", "r", "running")


def test_an_empty_cluster_gives_no_tasks():
    assert parse_qstat(qstat_doc().encode()) == []


@pytest.mark.parametrize(
    "data",
    [b"", b"   \n", b"error: commlib error: got select error (Connection refused)\n",
     b"<html><body>502</body></html>", qstat_doc(pending=job_list(1, "qw")).encode()[:-40],
     b"<?xml version='1.0'?><qhost></qhost>"],
    ids=["empty", "blank", "error-text", "html", "truncated", "wrong-root"],
)
def test_garbage_raises_scheduler_parse_error(data):
    with pytest.raises(SchedulerParseError):
        parse_qstat(data)


def test_a_job_list_without_a_job_number_or_with_a_bad_one_raises():
    without = qstat_doc(pending=job_list(1, "qw").replace("<JB_job_number>1</JB_job_number>", ""))
    with pytest.raises(SchedulerParseError):
        parse_qstat(without.encode())
    with pytest.raises(SchedulerParseError):
        parse_qstat(qstat_doc(pending=job_list("x1", "qw")).encode())
    with pytest.raises(SchedulerParseError):
        parse_qstat(qstat_doc(pending=job_list(1, "qw", time="yesterday")).encode())


# ------------------------------------------------------------------- diff

def task(job, number, state_code="qw", **changes) -> QstatTask:
    base = dict(job_number=job, task_number=number, name="agent", owner="tco", project=None, state="pending",
                state_code=state_code, restarted=False, queue=None, host=None, slots=1,
                submitted_at=utc(2025, 3, 10, 9, 0), started_at=None, priority=0.5)
    base.update(changes)
    return QstatTask(**base)


def test_diff_reports_added_changed_and_gone_tasks():
    before = [task(1, 1), task(1, 2), task(2, None)]
    previous = diff_tasks({}, before).current
    after = [task(1, 1), task(1, 2, "r", state="running", queue="agent.q", host="vm",
                               started_at=utc(2025, 3, 10, 9, 1)), task(3, None)]
    diff = diff_tasks(previous, after)
    assert [t.key for t in diff.added] == [(3, 0)]
    assert [t.key for t in diff.changed] == [(1, 2)]
    assert diff.changed[0].state == "running"
    assert [t.key for t in diff.gone] == [(2, 0)]
    assert set(diff.current) == {(1, 1), (1, 2), (3, 0)}


@pytest.mark.parametrize(
    "change",
    [{"state_code": "hqw"}, {"queue": "agent.q"}, {"host": "vm"}, {"slots": 2},
     {"started_at": utc(2025, 3, 10, 9, 5)}, {"priority": 0.6}],
)
def test_diff_counts_each_watched_field_as_a_change(change):
    previous = {(1, 1): task(1, 1)}
    assert [t.key for t in diff_tasks(previous, [task(1, 1, **change)]).changed] == [(1, 1)]


def test_diff_ignores_unwatched_fields_and_identical_tasks():
    previous = {(1, 1): task(1, 1)}
    diff = diff_tasks(previous, [task(1, 1, name="renamed")])
    assert (diff.added, diff.changed, diff.gone) == ([], [], [])


# ------------------------------------------------------------- qstat -g c

def test_cluster_queue_summary_numbers():
    data = b"""<?xml version='1.0'?>
<job_info  xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/qstat.xsd">
  <cluster_queue_summary>
    <name>agent.q</name>
    <load>0.05000</load>
    <used>3</used>
    <resv>0</resv>
    <available>5</available>
    <total>8</total>
    <temp_disabled>0</temp_disabled>
    <manual_intervention>0</manual_intervention>
  </cluster_queue_summary>
  <cluster_queue_summary>
    <name>classic.q</name>
    <used>0</used>
    <resv>1</resv>
    <available>0</available>
    <total>2</total>
    <temp_disabled>2</temp_disabled>
    <manual_intervention>1</manual_intervention>
  </cluster_queue_summary>
</job_info>
"""
    agent, classic = parse_cluster_queue_summary(data)
    assert agent == {"name": "agent.q", "load": 0.05, "used": 3, "resv": 0, "available": 5, "total": 8,
                     "temp_disabled": 0, "manual_intervention": 0}
    assert classic["load"] is None and classic["temp_disabled"] == 2 and classic["manual_intervention"] == 1


# ------------------------------------------------------------------ qhost

QHOST = b"""<?xml version='1.0'?>
<qhost xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qhost/qhost.xsd">
 <host name='global'>
   <hostvalue name='arch_string'>-</hostvalue>
   <hostvalue name='num_proc'>-</hostvalue>
   <hostvalue name='m_socket'>-</hostvalue>
   <hostvalue name='m_core'>-</hostvalue>
   <hostvalue name='m_thread'>-</hostvalue>
   <hostvalue name='load_avg'>-</hostvalue>
   <hostvalue name='mem_total'>-</hostvalue>
   <hostvalue name='mem_used'>-</hostvalue>
   <hostvalue name='swap_total'>-</hostvalue>
   <hostvalue name='swap_used'>-</hostvalue>
   <resourcevalue name='anthropic_api' dominance='gc'>3.000000</resourcevalue>
 </host>
 <host name='vm'>
   <hostvalue name='arch_string'>lx-amd64</hostvalue>
   <hostvalue name='num_proc'>2</hostvalue>
   <hostvalue name='m_socket'>1</hostvalue>
   <hostvalue name='m_core'>2</hostvalue>
   <hostvalue name='m_thread'>2</hostvalue>
   <hostvalue name='load_avg'>0.13</hostvalue>
   <hostvalue name='mem_total'>1.9G</hostvalue>
   <hostvalue name='mem_used'>985.3M</hostvalue>
   <hostvalue name='swap_total'>0.0</hostvalue>
   <hostvalue name='swap_used'>0.0</hostvalue>
   <resourcevalue name='arch' dominance='hl'>lx-amd64</resourcevalue>
   <resourcevalue name='num_proc' dominance='hl'>2</resourcevalue>
   <resourcevalue name='anthropic_api' dominance='gc'>3.000000</resourcevalue>
 </host>
</qhost>
"""


def test_qhost_includes_the_global_pseudo_host_with_none_values():
    hosts = {h["name"]: h for h in parse_qhost(QHOST)}
    assert hosts["global"] == {"name": "global", "arch": None, "num_proc": None, "load_avg": None,
                               "mem_total_bytes": None, "mem_used_bytes": None, "swap_total_bytes": None,
                               "swap_used_bytes": None,
                               "resources": {"anthropic_api": {"value": "3.000000", "dominance": "gc"}}}


def test_qhost_memory_strings_become_bytes():
    vm = {h["name"]: h for h in parse_qhost(QHOST)}["vm"]
    assert vm["arch"] == "lx-amd64" and vm["num_proc"] == 2 and vm["load_avg"] == 0.13
    assert vm["mem_total_bytes"] == round(1.9 * 1024**3)
    assert vm["mem_used_bytes"] == round(985.3 * 1024**2)
    assert vm["swap_total_bytes"] == 0
    assert vm["resources"]["arch"] == {"value": "lx-amd64", "dominance": "hl"}


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.9G", 2040109466), ("985.3M", 1033161933), ("512K", 524288), ("2T", 2 * 1024**4), ("0.0", 0),
     ("1000", 1000), ("1k", 1000), ("1g", 10**9), ("-", None), ("", None), (None, None)],
)
def test_memory_values_use_1024_for_upper_case_and_1000_for_lower_case(text, value):
    assert parse_memory(text) == value


def test_a_memory_value_that_is_not_one_raises():
    with pytest.raises(SchedulerParseError):
        parse_memory("lots")


# ----------------------------------------------------------------- qquota

def test_qquota_limits_with_filters_and_excludes():
    data = b"""<?xml version='1.0'?>
<qquota_result xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qquota/qquota.xsd">
 <qquota_rule name='agent_cap/1'>
   <users>tco</users>
   <xprojects>batch,legacy</xprojects>
   <limit resource='slots' limit='8' value='8'/>
 </qquota_rule>
 <qquota_rule name='mem_cap/hosts'>
   <hosts>vm</hosts>
   <limit resource='h_vmem' limit='4G' value='2.000G'/>
   <limit resource='arch' limit='lx-amd64'/>
 </qquota_rule>
</qquota_result>
"""
    cap, mem, arch = parse_qquota(data)
    assert cap == {"rule": "agent_cap/1", "resource": "slots", "limit": 8, "used": 8,
                   "filters": {"users": ["tco"], "xprojects": ["batch", "legacy"]}}
    assert (mem["rule"], mem["limit"], mem["used"], mem["filters"]) == ("mem_cap/hosts", "4G", "2.000G",
                                                                        {"hosts": ["vm"]})
    assert arch["used"] is None


def test_qquota_with_an_ocs_default_namespace_is_read_the_same():
    data = b"""<?xml version='1.0'?>
<qquota_result xmlns="https://github.com/hpc-gridware/clusterscheduler/raw/master/source/dist/util/resources/schemas/qquota/qquota.xsd">
 <qquota_rule name='agent_cap/1'>
   <projects>research</projects>
   <limit resource='anthropic_api' limit='96' value='96'/>
 </qquota_rule>
</qquota_result>
"""
    assert parse_qquota(data) == [{"rule": "agent_cap/1", "resource": "anthropic_api", "limit": 96, "used": 96,
                                   "filters": {"projects": ["research"]}}]


def test_qquota_with_no_rule_in_use_is_empty():
    assert parse_qquota(b"<?xml version='1.0'?>\n<qquota_result>\n</qquota_result>\n") == []


# ------------------------------------------------------------ qstat -j

QSTAT_J_SGE8 = b"""<?xml version='1.0'?>
<detailed_job_info  xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/detailed_job_info.xsd">
  <djob_info>
    <element>
      <JB_job_number>812</JB_job_number>
      <JB_job_name>sweep</JB_job_name>
      <JB_version>0</JB_version>
      <JB_jid_predecessor_list>
        <job_predecessors>
          <JRE_job_number>811</JRE_job_number>
          <JRE_job_name>prepare</JRE_job_name>
        </job_predecessors>
      </JB_jid_predecessor_list>
      <JB_session>NONE</JB_session>
      <JB_department>defaultdepartment</JB_department>
      <JB_submission_time>1741597200</JB_submission_time>
      <JB_owner>tco</JB_owner>
      <JB_context>
        <context_list>
          <VA_variable>tco_campaign</VA_variable>
          <VA_value>17</VA_value>
        </context_list>
        <context_list>
          <VA_variable>tco_team</VA_variable>
          <VA_value>research</VA_value>
        </context_list>
      </JB_context>
      <JB_hard_resource_list>
        <qstat_l_requests>
          <CE_name>anthropic_api</CE_name>
          <CE_valtype>1</CE_valtype>
          <CE_stringval>1</CE_stringval>
          <CE_doubleval>1.000000</CE_doubleval>
        </qstat_l_requests>
        <element>
          <CE_name>h_vmem</CE_name>
          <CE_valtype>6</CE_valtype>
          <CE_stringval>2G</CE_stringval>
          <CE_doubleval>2147483648.000000</CE_doubleval>
        </element>
      </JB_hard_resource_list>
      <JB_ja_u_h_ids>
        <ja_u_h_ids>
          <RN_min>4</RN_min>
          <RN_max>6</RN_max>
          <RN_step>1</RN_step>
        </ja_u_h_ids>
      </JB_ja_u_h_ids>
      <JB_ja_tasks>
        <ulong_sublist>
          <JAT_task_number>1</JAT_task_number>
          <JAT_status>128</JAT_status>
          <JAT_start_time>1741597260</JAT_start_time>
        </ulong_sublist>
        <ulong_sublist>
          <JAT_task_number>2</JAT_task_number>
          <JAT_status>32784</JAT_status>
        </ulong_sublist>
        <ulong_sublist>
          <JAT_task_number>3</JAT_task_number>
          <JAT_status>1152</JAT_status>
        </ulong_sublist>
      </JB_ja_tasks>
    </element>
  </djob_info>
  <messages>
    <element>
      <SME_message_list>
        <element>
          <MES_job_number_list>
            <ulong_sublist>
              <ULNG_value>812</ULNG_value>
            </ulong_sublist>
          </MES_job_number_list>
          <MES_message_number>47144</MES_message_number>
          <MES_message>cannot run because it exceeds limit "tco/////" in rule "agent_cap/1"</MES_message>
        </element>
      </SME_message_list>
      <SME_global_message_list>
        <element>
          <MES_message_number>47114</MES_message_number>
          <MES_message>Jobs can not run because all queue instances are overloaded or full</MES_message>
        </element>
      </SME_global_message_list>
    </element>
  </messages>
</detailed_job_info>
"""


def test_job_detail_reads_every_resource_request_whatever_its_tag():
    detail = parse_job_detail(QSTAT_J_SGE8)
    assert detail["hard_resources"] == {"anthropic_api": "1", "h_vmem": "2G"}


def test_job_detail_fields_tasks_and_messages():
    detail = parse_job_detail(QSTAT_J_SGE8)
    assert (detail["job_number"], detail["name"], detail["owner"], detail["project"]) == (812, "sweep", "tco", None)
    assert detail["submitted_at"] == utc(2025, 3, 10, 9, 0, 0)
    assert detail["tasks"] == [{"task_number": 1, "state": "running"}, {"task_number": 2, "state": "error"},
                               {"task_number": 3, "state": "deleting"}]
    assert detail["scheduler_messages"] == ['cannot run because it exceeds limit "tco/////" in rule "agent_cap/1"']
    assert detail["global_messages"] == ["Jobs can not run because all queue instances are overloaded or full"]
    assert detail["context"] == {"tco_campaign": "17", "tco_team": "research"}
    assert detail["predecessors"] == [811]
    assert detail["holds"] == {"user": [[4, 6, 1]]}


def test_job_detail_holds_of_enrolled_pending_tasks_but_not_of_running_ones():
    data = QSTAT_J_SGE8.replace(b"<JAT_status>32784</JAT_status>", b"<JAT_status>64</JAT_status>\n"
                                b"          <JAT_hold>2</JAT_hold>")
    data = data.replace(b"<JAT_status>128</JAT_status>", b"<JAT_status>128</JAT_status><JAT_hold>1</JAT_hold>")
    detail = parse_job_detail(data)
    assert detail["tasks"][1] == {"task_number": 2, "state": "held"}
    assert detail["holds"] == {"operator": [[2, 2, 1]], "user": [[4, 6, 1]]}


def test_job_detail_of_ocs9_reads_iso_times_and_only_its_own_messages():
    detail = parse_job_detail((OCS9 / "qstat_j.xml").read_bytes(), ZoneInfo("Europe/Berlin"))
    assert detail["project"] == "research"
    assert detail["submitted_at"] == utc(2026, 3, 2, 13, 4, 59, 500000)
    assert detail["hard_resources"] == {"anthropic_api": "1", "h_rt": "3600.000000"}
    assert detail["tasks"] == [{"task_number": 1, "state": "running"}, {"task_number": 2, "state": "running"}]
    assert detail["holds"] == {}  # task 2 is "hr": held, but already running
    assert detail["scheduler_messages"] == [
        "(-l anthropic_api=1) cannot run globally because it offers only gc:anthropic_api=0.000000"]
    assert detail["context"] == {"tco_campaign": "17"}


@pytest.mark.parametrize(
    ("status", "hold", "state"),
    [(0x80, 0, "running"), (0x8010, 0, "error"), (0x480, 0, "deleting"), (0x180, 0, "suspended"),
     (0x200, 0, "starting"), (0x40, 0, "pending"), (0x40, 1, "held"), (0x10, 0, "held"), (0x800, 0, "pending"),
     (0x1000, 0, "running"), (0, 0, "pending"), (0x20, 0, "unknown")],
)
def test_jat_status_bits_are_tested_not_compared(status, hold, state):
    assert job_status_state(status, hold) == state


def test_an_unknown_job_id_raises_unknown_job_with_the_id():
    with pytest.raises(UnknownJob) as caught:
        parse_job_detail(b"<unknown_jobs><><ST_name>1</ST_name></></unknown_jobs>\n")
    assert caught.value.job_ids == ["1"]


@pytest.mark.parametrize("data", [b"", b"no job", b"<?xml version='1.0'?><detailed_job_info/>"])
def test_job_detail_garbage_or_no_job_raises_parse_error(data):
    with pytest.raises(SchedulerParseError):
        parse_job_detail(data)
