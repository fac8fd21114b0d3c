"""Issue 16, bug 11: the cluster card said "agent.q 96/96 slots used" while the quota line said
"73 of 96". The card now splits the slots with one definition (dashboards.live.cluster.queue_slots)
whose parts add up to the total, and names the queue instances that make slots unavailable."""
from __future__ import annotations

from pathlib import Path


from dashboards.live.cluster import queue_slots
from schedulers.gridengine.parsers.queue_summary import parse_cluster_queue_summary
from schedulers.hosts import parse_queue_instances

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_slots_of_a_disabled_and_an_unknown_instance_are_unavailable_not_in_use():
    # qstat -f -xml of the multi-host dev cluster: agent.q@mh-exec1 unknown with 2 tasks on it
    # (48 slots), agent.q@mh-exec2 disabled (48 slots, empty), classic.q@mh-exec3 fine (2 slots).
    instances = parse_queue_instances(fixture("multihost/qstat_f_unknown_disabled.xml"))
    queues = [{"name": "agent.q", "used": 2, "resv": 0, "available": 0, "total": 96},
              {"name": "classic.q", "used": 0, "resv": 0, "available": 2, "total": 2}]
    agent, classic = queue_slots(queues, instances)
    assert (agent["total"], agent["in_use"], agent["reserved"], agent["unavailable"], agent["free"]) == \
        (96, 2, 0, 48 - 2 + 48, 0)
    assert [(i["name"], i["states"], i["slots"]) for i in agent["unavailable_instances"]] == \
        [("agent.q@mh-exec1", "u", 46), ("agent.q@mh-exec2", "d", 48)]
    assert agent["unavailable_instances"][1]["meanings"] == ["disabled"]
    assert (classic["total"], classic["in_use"], classic["unavailable"], classic["free"]) == (2, 0, 0, 2)
    for row in (agent, classic):
        assert row["in_use"] + row["reserved"] + row["unavailable"] + row["free"] == row["total"]


def test_a_load_alarm_makes_the_free_slots_unavailable():
    instances = parse_queue_instances(fixture("multihost/qstat_f_alarm.xml"))
    [classic] = queue_slots([{"name": "classic.q", "used": 0, "resv": 0, "available": 0, "total": 2}], instances)
    assert (classic["unavailable"], classic["free"]) == (2, 0)
    assert classic["unavailable_instances"][0]["meanings"][0].startswith("load alarm")


def test_without_queue_instances_qstat_g_c_gives_the_same_split():
    [agent] = parse_cluster_queue_summary(fixture("sge819/qstat_g_c.xml"))[:1]
    [row] = queue_slots([agent], [])
    assert row["source"] == "qstat -g c"
    assert row["in_use"] == agent["used"] and row["free"] == agent["available"]
    assert row["in_use"] + row["reserved"] + row["unavailable"] + row["free"] == agent["total"]
