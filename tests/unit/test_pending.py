"""Pending reasons in plain words, from qstat -j details (and qquota/qhost numbers)."""
from __future__ import annotations

from pathlib import Path

from schedulers.pending import explain_pending


def detail(**fields) -> dict:
    base = {"job_number": 812, "name": "sweep", "owner": "tco", "project": "research", "hard_resources": {},
            "tasks": [], "holds": {}, "predecessors": [], "scheduler_messages": [], "global_messages": [],
            "context": {}}
    base.update(fields)
    return base


def texts(reasons: list[dict]) -> list[str]:
    return [r["text"] for r in reasons]


def test_a_quota_limit_names_the_rule_set_and_who():
    raw = 'cannot run because it exceeds limit "tco/////" in rule "agent_cap/1"'
    (reason,) = explain_pending(detail(scheduler_messages=[raw]))
    assert reason == {"text": "agent quota reached: user tco (RQS agent_cap)", "raw": raw}


def test_a_quota_limit_with_qquota_numbers():
    raw = 'cannot run because it exceeds limit "tco/////" in rule "agent_cap/1"'
    quota = [{"rule": "other/1", "resource": "slots", "limit": 2, "used": 1, "filters": {}},
             {"rule": "agent_cap/1", "resource": "slots", "limit": 8, "used": 8, "filters": {"users": ["tco"]}}]
    assert texts(explain_pending(detail(scheduler_messages=[raw]), quota=quota)) == [
        "agent quota reached: slots 8 of 8 for user tco (RQS agent_cap)"]


def test_a_cluster_wide_quota_says_so():
    raw = 'cannot run because it exceeds limit "/////" in rule "agent_cap/1"'
    assert texts(explain_pending(detail(scheduler_messages=[raw]))) == [
        "agent quota reached: cluster-wide (RQS agent_cap)"]


def test_a_global_consumable_shortage_is_a_model_api_seat():
    raw = "(-l anthropic_api=1) cannot run globally because it offers only gc:anthropic_api=0.000000"
    (reason,) = explain_pending(detail(scheduler_messages=[raw]), capacities={"anthropic_api": 96})
    assert reason == {"text": ("waiting for a model API seat: the job asks 1 (-l anthropic_api=1); 96 of 96 in use, "
                              "0 free (consumable anthropic_api, global)"),
                      "raw": raw}


def test_a_global_consumable_uses_qhost_for_what_is_free_now():
    raw = "(-l anthropic_api=2) cannot run globally because it offers only gc:anthropic_api=1.000000"
    hosts = [{"name": "global", "resources": {"anthropic_api": {"value": "1.000000", "dominance": "gc"}}}]
    assert texts(explain_pending(detail(scheduler_messages=[raw]), hosts=hosts, capacities={"anthropic_api": 8})) == [
        "waiting for a model API seat: the job asks 2 (-l anthropic_api=2); 7 of 8 in use, 1 free "
        "(consumable anthropic_api, global)"]
    assert texts(explain_pending(detail(scheduler_messages=[raw]))) == [
        "waiting for a model API seat: the job asks 2 (-l anthropic_api=2); 1 free (consumable anthropic_api, global)"]


def test_holds_name_who_holds_which_tasks():
    reasons = explain_pending(detail(holds={"user": [[4, 6, 1]], "operator": [[9, 9, 1]]},
                                     scheduler_messages=["Job is in hold state"]))
    assert texts(reasons) == ["held by user (tasks 4-6)", "held by operator (tasks 9)"]


def test_a_hold_message_without_hold_details_still_says_held():
    assert texts(explain_pending(detail(scheduler_messages=["Job is in hold state"]))) == [
        "held by user/operator/system"]


def test_dependencies_name_the_job_waited_for_once():
    message = "job dropped because of job dependencies"
    assert texts(explain_pending(detail(predecessors=[811], scheduler_messages=[message]))) == [
        "waiting for job 811 to finish"]
    assert texts(explain_pending(detail(predecessors=[811, 820]))) == ["waiting for jobs 811, 820 to finish"]


def test_error_state_says_what_to_do():
    reasons = explain_pending(detail(tasks=[{"task_number": 2, "state": "error"}],
                                     scheduler_messages=["Job is in error state"]))
    assert len(reasons) == 1
    assert reasons[0]["text"].startswith("in error state") and "qmod -cj 812" in reasons[0]["text"]


def test_hard_queue_list_messages_collapse_into_one_reason():
    raws = [f'cannot run in queue "q{n}.q" because it is not contained in its hard queue list (-q)'
            for n in range(3)]
    (reason,) = explain_pending(detail(scheduler_messages=raws))
    assert reason["text"] == "only runs in the queues it requested (-q); 3 other queue(s) skipped"
    assert reason["raw"].endswith("(+2 similar)")


def test_host_shortage_and_unavailable_queue_instances():
    raws = ['(-l h_vmem=4G) cannot run at host "node01" because it offers only hc:h_vmem=2.000G',
            'queue instance "agent.q@node02" dropped because it is temporarily not available']
    assert texts(explain_pending(detail(scheduler_messages=raws))) == [
        "host node01 has only 2.000G h_vmem free, 4G requested",
        "queue instance agent.q@node02 is unavailable (exec host down or not reporting)"]


def test_scheduler_info_turned_off_is_explained_from_the_global_messages():
    reasons = explain_pending(detail(global_messages=["(Collecting of scheduler job information is turned off)",
                                                      "something else global"]))
    assert texts(reasons) == ["the scheduler does not record reasons (schedd_job_info false); try qalter -w p"]


def test_unknown_messages_are_passed_through():
    raw = "a brand new scheduler message"
    assert explain_pending(detail(scheduler_messages=[raw])) == [{"text": raw, "raw": raw}]


def test_a_job_with_nothing_to_say_has_no_reasons():
    assert explain_pending(detail(tasks=[{"task_number": 1, "state": "running"}])) == []


def test_policy_position_names_the_rank_and_a_team_above_its_configured_share():
    from schedulers.pending import policy_position

    tree = [{"node": "/", "user": None, "project": None, "shares": 1, "long_target_share": 1.0, "actual_share": 1.0},
            {"node": "/research", "user": None, "project": "research", "shares": 50, "long_target_share": 0.5,
             "actual_share": 0.976},
            {"node": "/engineering", "user": None, "project": "engineering", "shares": 50,
             "long_target_share": 0.5, "actual_share": 0.024}]
    research = policy_position(rank=3, of=40, priority=0.5, project="research", share_tree=tree)
    assert research[0]["text"] == "number 3 of 40 waiting jobs in the cluster's priority order"
    assert research[1]["text"] == ("team research has used 98% of the cluster lately, above the 50% its 50 of 100 "
                                   "share-tree shares give it, so its jobs get fewer tickets than other teams' "
                                   "waiting jobs")
    engineering = policy_position(rank=1, of=40, priority=0.9, project="engineering", share_tree=tree)
    assert engineering[1]["text"] == ("team engineering has used 2% of the cluster lately, within the 50% its 50 of "
                                      "100 share-tree shares give it")
    assert len(policy_position(rank=1, of=1, priority=None, project="other", share_tree=tree)) == 1




# --------------------------------------------------------------------------- the share tree, from sge_share_mon

SGE819 = Path(__file__).resolve().parents[1] / "fixtures" / "sge819"


def _captured_tree(**research) -> list[dict]:
    """sge_share_mon -c 1 -n as captured on SGE 8.1.9 (research 50 shares, engineering 50 shares with
    job_count=0, so long_target_share=0), research's node changed by ``research``."""
    from schedulers.gridengine.parsers.sharetree import parse_share_mon

    tree = parse_share_mon((SGE819 / "sge_share_mon_n.txt").read_bytes())
    for node in tree:
        if node["project"] == "research":
            node.update(research)
    return tree


def test_the_share_tree_line_gives_the_configured_shares_not_an_idle_nodes_zero_target():
    from schedulers.pending import reason_kind, share_tree_standing

    tree = _captured_tree()
    engineering = next(n for n in tree if n["project"] == "engineering")
    assert engineering["long_target_share"] == 0.0 and engineering["job_count"] == 0  # what the old line quoted
    line = share_tree_standing("engineering", tree)
    assert line["text"] == ("team engineering has used 1% of the cluster lately, within the 50% its 50 of 100 "
                            "share-tree shares give it")
    assert " 0%" not in line["text"] and "job_count=0" in line["raw"]
    assert reason_kind(line["text"])["kind"] == "priority_order"
    # The demo's case: research's node counted no jobs (long_target_share 0) while it used 86%.
    research = share_tree_standing("research", _captured_tree(long_target_share=0.0, job_count=0,
                                                              actual_share=0.86))
    assert research["text"] == ("team research has used 86% of the cluster lately, above the 50% its 50 of 100 "
                                "share-tree shares give it, so its jobs get fewer tickets than other teams' "
                                "waiting jobs")
    assert reason_kind(research["text"])["kind"] == "share_tree"
    assert share_tree_standing("nobody", tree) is None


def test_a_job_first_in_line_behind_a_full_queue_instance_reads_the_queue_first():
    """qstat -j of a job pending behind the full classic.q (SGE 8.1.9 capture), first in line, its team
    above its part of the share tree: the full queue instance comes before the share-tree line."""
    from schedulers.gridengine.parsers.qstat_j import parse_job_detail
    from schedulers.pending import policy_position, position_rank

    job = parse_job_detail((SGE819 / "qstat_j_pending_classic.xml").read_bytes())
    reasons = explain_pending(job) + policy_position(rank=1, of=3, priority=0.5, project="research",
                                                     share_tree=_captured_tree(actual_share=0.86))
    assert texts(reasons)[0] == "queue instance classic.q@vm is full"
    assert texts(reasons)[-1].endswith("so its jobs get fewer tickets than other teams' waiting jobs")
    assert [position_rank(t) for t in texts(reasons)].count(1) == 1
