"""Runner records: stages and the metering proxy's requests land on their task; bad records are set aside."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.models import AgentDefinition, Campaign, ModelRequest, Task
from dashboards.core.accounts import team_ensure
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest.runner_records import ingest_runner_records

pytestmark = pytest.mark.django_db


@pytest.fixture
def campaign(django_user_model):
    cluster = cluster_get_default()
    team = team_ensure(name="research", project="research")
    user = django_user_model.objects.create_user("launcher")
    agent = AgentDefinition.objects.create(name="a", command=["true"])
    c = Campaign.objects.create(name="c", cluster=cluster, team=team, agent_definition=agent, launched_by=user,
                                queue="agent.q", task_count=1, launched_at=timezone.now(), job_number=77)
    Task.objects.create(cluster=cluster, campaign=c, job_number=77, task_number=1, is_array=True, state="running")
    return c


def request(at: str, model: str, usage: dict, cost: str | None) -> dict:
    return {"at": at, "method": "POST", "path": "/v1/messages", "status": 200, "refused": None,
            "model_requested": model, "model_returned": model, "usage": {"provider": "anthropic", **usage},
            "cost_usd": cost, "latency_ms": 12.5, "complete": True, "flags": []}


def write_record(spool, campaign, **extra):
    record = {"version": 1, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77,
              "stages": {"task_started_at": "2026-11-29T12:00:00.000100Z", "agent_started_at": "2026-11-29T12:00:00.020Z",
                         "agent_exited_at": "2026-11-29T12:00:05.5Z", "teardown_done_at": "2026-11-29T12:00:05.51Z"},
              "exit_status": 0, **extra}
    path = spool / "records" / str(campaign.pk) / "1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def test_it_sums_the_requests_into_the_task_and_keeps_each_one(tmp_path, campaign):
    reqs = [
        request("2026-11-29T12:00:01Z", "m1", {"input_tokens": 100, "cache_read_tokens": 1000,
                                                "cache_write_5m_tokens": 50, "output_tokens": 20}, "0.0012"),
        request("2026-11-29T12:00:03Z", "m1", {"input_tokens": 10, "cache_write_1h_tokens": 7, "output_tokens": 5,
                                                "reasoning_tokens": 2}, "0.0003"),
    ]
    path = write_record(tmp_path, campaign, requests=reqs)
    assert ingest_runner_records(campaign.cluster, spool=tmp_path).ingested == 1
    task = Task.objects.get()
    assert (task.input_tokens, task.cache_read_tokens, task.cache_write_5m_tokens, task.cache_write_1h_tokens,
            task.output_tokens, task.reasoning_tokens) == (110, 1000, 50, 7, 25, 2)
    assert task.cost_usd == Decimal("0.0015")
    assert task.agent_exited_at.isoformat() == "2026-11-29T12:00:05.500000+00:00"
    assert ModelRequest.objects.filter(task=task).count() == 2
    assert not path.exists() and (tmp_path / "ingested" / str(campaign.pk) / "1.json").exists()


def test_an_unpriced_request_makes_the_cost_unknown_not_lower(tmp_path, campaign):
    reqs = [request("2026-11-29T12:00:01Z", "m1", {"input_tokens": 100, "output_tokens": 20}, "0.001"),
            request("2026-11-29T12:00:02Z", "mystery", {"input_tokens": 5, "output_tokens": 5,
                                                        "flags": ["unpriced_model"]}, None)]
    write_record(tmp_path, campaign, requests=reqs)
    ingest_runner_records(campaign.cluster, spool=tmp_path)
    task = Task.objects.get()
    assert task.cost_usd is None and "unpriced_model" in task.usage_flags
    assert task.input_tokens == 105


def test_a_requests_file_outside_the_spool_is_quarantined(tmp_path, campaign):
    outside = tmp_path.parent / "elsewhere.jsonl"
    outside.write_text("")
    write_record(tmp_path, campaign, requests_path=str(outside))
    assert ingest_runner_records(campaign.cluster, spool=tmp_path).ingested == 0
    assert (tmp_path / "quarantine" / str(campaign.pk) / "1.json").exists()
    assert Task.objects.get().task_started_at is None


def test_a_declared_verdict_output_becomes_the_tasks_verdict(tmp_path, campaign):
    out = tmp_path / "records" / str(campaign.pk) / "1.outputs" / "verdict.json"
    out.parent.mkdir(parents=True)
    out.write_text('{"verdict": "bad", "sweep_task": 1}')
    write_record_at = tmp_path / "records" / str(campaign.pk) / "1.json"
    record = {"version": 2, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77, "stages": {},
              "outputs": [{"name": "verdict.json", "path": str(out)}]}
    write_record_at.write_text(json.dumps(record))
    ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert Task.objects.get().verdict == "bad"


def test_a_verdict_path_outside_the_spool_is_not_read(tmp_path, campaign):
    outside = tmp_path.parent / "verdict.json"
    outside.write_text('{"verdict": "ok"}')
    path = tmp_path / "records" / str(campaign.pk) / "1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 2, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77,
                                "stages": {}, "outputs": [{"name": "verdict.json", "path": str(outside)}]}))
    ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert Task.objects.get().verdict == ""


# --------------------------------------------------------------------------- refused records

@pytest.mark.parametrize("version", [3, "2", None])
def test_a_record_of_an_unknown_version_is_quarantined_counted_and_never_stored(tmp_path, campaign, version):
    path = write_record(tmp_path, campaign)
    data = json.loads(path.read_text())
    data["version"] = version
    path.write_text(json.dumps(data))
    result = ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert (result.ingested, result.quarantined, result.unknown_version) == (0, 1, 1)
    assert result.as_dict()["unknown_version"] == 1
    assert not path.exists() and (tmp_path / "quarantine" / str(campaign.pk) / "1.json").exists()
    assert not (tmp_path / "ingested").exists()
    task = Task.objects.get()
    assert task.task_started_at is None and task.runner_record is None


def test_a_malformed_record_is_quarantined_apart_from_unknown_versions(tmp_path, campaign):
    path = write_record(tmp_path, campaign)
    data = json.loads(path.read_text())
    data["stages"]["task_started_at"] = "2026-11-29T12:00:00"  # no zone
    path.write_text(json.dumps(data))
    result = ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert (result.ingested, result.quarantined, result.unknown_version) == (0, 1, 0)
    assert (tmp_path / "quarantine" / str(campaign.pk) / "1.json").exists()
    assert Task.objects.get().task_started_at is None


def test_a_record_whose_task_is_not_known_yet_waits_where_it_was(tmp_path, campaign):
    path = write_record(tmp_path, campaign)
    Task.objects.all().delete()
    result = ingest_runner_records(campaign.cluster, spool=tmp_path)
    assert (result.ingested, result.waiting) == (0, 1)
    assert sorted(p.name for p in path.parent.iterdir()) == ["1.json"]  # no claim left behind
    Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=77, task_number=1, is_array=True,
                        state="running")
    assert ingest_runner_records(campaign.cluster, spool=tmp_path).ingested == 1


def test_a_claim_left_by_a_dead_ingester_is_taken_over(tmp_path, campaign, monkeypatch):
    

    path = write_record(tmp_path, campaign)
    claim = path.with_name(".1.json.claim-deadhost-1-abc")
    path.rename(claim)
    assert ingest_runner_records(campaign.cluster, spool=tmp_path).ingested == 0  # fresh: its owner may be alive
    monkeypatch.setattr("dashboards.ingest.runner_records.CLAIM_STALE_S", -1.0)
    assert ingest_runner_records(campaign.cluster, spool=tmp_path).ingested == 1
    assert not claim.exists() and (tmp_path / "ingested" / str(campaign.pk) / "1.json").exists()
    assert Task.objects.get().task_started_at is not None


# --------------------------------------------------------------------------- concurrent ingesters

def two_requests() -> list[dict]:
    return [request("2026-11-29T12:00:01Z", "m1", {"input_tokens": 100, "output_tokens": 20}, "0.001"),
            request("2026-11-29T12:00:02Z", "m1", {"input_tokens": 7, "output_tokens": 3}, "0.0001")]


def assert_ingested_once(task: Task) -> None:
    """The rows a single ingest of two_requests() gives (computed by hand)."""
    assert (task.input_tokens, task.output_tokens, task.cost_usd) == (107, 23, Decimal("0.0011"))
    assert list(ModelRequest.objects.filter(task=task).order_by("seq").values_list("seq", "input_tokens")) == \
        [(1, 100), (2, 7)]
    assert task.agent_exited_at.isoformat() == "2026-11-29T12:00:05.500000+00:00"


@pytest.mark.django_db(transaction=True)
def test_two_ingesters_racing_on_one_record_neither_fail_nor_double_count(tmp_path, campaign, monkeypatch):
    """Both list the record before either takes it (a barrier after the listing): before the
    claim, the second one's move raised FileNotFoundError (issue 15)."""
    import threading

    from execution.spool.layout import SpoolLayout

    write_record(tmp_path, campaign, requests=two_requests())
    listing = SpoolLayout.record_files
    barrier = threading.Barrier(2, timeout=20)

    def list_then_wait(self):
        found = listing(self)
        barrier.wait()
        return found

    monkeypatch.setattr(SpoolLayout, "record_files", list_then_wait)
    results, errors = [], []

    def ingest_once():
        from django.db import connection

        try:
            results.append(ingest_runner_records(campaign.cluster, spool=tmp_path))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ingest_once) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted((r.ingested, r.raced) for r in results) == [(0, 1), (1, 0)]
    assert_ingested_once(Task.objects.get())
    assert (tmp_path / "ingested" / str(campaign.pk) / "1.json").exists()
    assert not list((tmp_path / "records" / str(campaign.pk)).iterdir())


@pytest.mark.django_db(transaction=True)
def test_the_same_record_stored_by_two_ingesters_at_once_gives_the_rows_of_one(tmp_path, campaign):
    """A claim taken over from an ingester thought dead: both store the record, concurrently."""
    import threading

    from dashboards.ingest import runner_records
    from execution.spool.layout import SpoolLayout

    layout = SpoolLayout(tmp_path)
    path = write_record(tmp_path, campaign, requests=two_requests())
    claims = [path.with_name(f".1.json.claim-{n}") for n in (1, 2)]
    for claim in claims:
        claim.write_bytes(path.read_bytes())
    barrier = threading.Barrier(2, timeout=20)
    outcomes, errors = [], []

    def store(claim):
        from django.db import connection

        try:
            barrier.wait()
            outcomes.append(runner_records._ingest_claimed(campaign.cluster, str(claim), layout, 100,
                                                   runner_records.RunnerIngestResult()))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=store, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and outcomes == [campaign.pk, campaign.pk]
    assert_ingested_once(Task.objects.get())
    assert ModelRequest.objects.count() == 2


# --------------------------------------------------------------------------- bounded memory

def test_a_50_mb_requests_file_is_streamed_with_a_cap_on_kept_rows(tmp_path, campaign):
    """Issue 11 finding 5: ingest read the whole file (219 MiB to parse 47 MB). Peak traced memory
    must stay far below the file's size; the totals still count every request."""
    import tracemalloc

    records = tmp_path / "records" / str(campaign.pk)
    records.mkdir(parents=True)
    requests_file = records / "1.requests.jsonl"
    pad = "p" * 10_000  # a refused request's body excerpt, say
    line_count = 0
    with open(requests_file, "w") as fh:
        while fh.tell() < 50 * 1024 * 1024:
            line_count += 1
            item = request("2026-11-29T12:00:01Z", "m1", {"input_tokens": 3, "output_tokens": 2}, "0.00001")
            fh.write(json.dumps({**item, "pad": pad}) + "\n")
    size = requests_file.stat().st_size
    assert size >= 50 * 1024 * 1024
    path = records / "1.json"
    path.write_text(json.dumps({"version": 2, "campaign_id": campaign.pk, "task_number": 1, "job_number": 77,
                                "stages": {}, "requests_path": str(requests_file)}))
    tracemalloc.start()
    try:
        result = ingest_runner_records(campaign.cluster, spool=tmp_path, requests_kept=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ingested == 1 and result.requests_skipped == line_count - 100
    assert peak < 8 * 1024 * 1024 < size // 6, f"peak {peak} bytes while ingesting a {size}-byte file"
    task = Task.objects.get()
    assert (task.input_tokens, task.output_tokens) == (3 * line_count, 2 * line_count)
    assert task.cost_usd == Decimal("0.00001") * line_count
    assert "requests_not_kept" in task.usage_flags
    assert ModelRequest.objects.filter(task=task).count() == 100
    assert task.runner_record["ingest"] == {"requests": line_count, "requests_kept": 100,
                                            "requests_skipped": line_count - 100}
