"""Form data of the ops pages."""
from __future__ import annotations

from dashboards.models import AgentDefinition, Team


def launch_data(**overrides):
    data = {"agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
            "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "1",
            "name": "sweep-1", "input_kind": "params", "input_params": "task=1..3", "priority": "0",
            "model": "", "policy": "", "concurrency_cap": "", "predecessor_job": "", "token_cap": "",
            "cost_cap_usd": "", "input_jsonl": "", "input_directory": ""}
    data.update(overrides)
    return data


#: Hostile launch form fields and the field that refuses each.
HOSTILE = [
    ({"name": "-u root"}, "name"),
    ({"name": "x; rm -rf /"}, "name"),
    ({"name": "two\nlines"}, "name"),
    ({"name": "with space"}, "name"),
    ({"name": "a:b"}, "name"),
    ({"queue": "agent.q -u root"}, "queue"),
    ({"queue": "agent.q\n-l h_rt=1"}, "queue"),
    ({"model": "; rm -rf /"}, "model"),
    ({"model": "m -u root"}, "model"),
    ({"seats_per_task": "-1"}, "seats_per_task"),
    ({"seats_per_task": "99999999999999999999"}, "seats_per_task"),
    ({"priority": "1024"}, "priority"),
    ({"priority": "5000"}, "priority"),
    ({"priority": "1; qdel -u '*'"}, "priority"),
    ({"concurrency_cap": "-3"}, "concurrency_cap"),
    ({"concurrency_cap": "10"}, "concurrency_cap"),
    ({"predecessor_job": "-1"}, "predecessor_job"),
    ({"predecessor_job": "12 -u root"}, "predecessor_job"),
    ({"token_cap": "-10"}, "token_cap"),
    ({"cost_cap_usd": "NaN"}, "cost_cap_usd"),
    ({"input_params": "seed=1..100000000"}, "input_params"),
    ({"input_params": "seed=10..-10"}, "input_params"),
    ({"input_params": ""}, "input_params"),
    ({"input_kind": "jsonl", "input_jsonl": "{\"a\": 1}\n-u root"}, "input_jsonl"),
    ({"input_kind": "directory", "input_directory": "../../etc"}, "input_directory"),
    ({"policy": "version: 1\nexec: 'rm -rf /'"}, "policy"),
    ({"team": "engineering"}, "team"),
    ({"memory_mib": "4097"}, "memory_mib"),  # the site's maximum is the runner's default, 4 GiB
    ({"memory_mib": "99999999999999999999"}, "memory_mib"),
    ({"memory_mib": "-1"}, "memory_mib"),
    ({"memory_mib": "1 GiB"}, "memory_mib"),
    ({"work_mib": "0"}, "work_mib"),
    ({"work_mib": "4097"}, "work_mib"),
]
