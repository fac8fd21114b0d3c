"""The FOCUS export (dashboards.billing.focus): the bill's totals in FOCUS 1.2 rows, checked by focus-validator."""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
import subprocess
from decimal import Decimal
from pathlib import Path
from xml.etree import ElementTree

import pytest

from dashboards.billing import bills, focus
from dashboards.models import AccountingRecord, Cluster, ModelRequest, Team
from dashboards.core import rollups
from dashboards.core.clusters import cluster_get_default
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc
REPO = Path(__file__).resolve().parents[2]
NY = "America/New_York"


def at(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def tokens(inp=0, read=0, w5=0, w1=0, out=0, reasoning=0) -> dict:
    return {"input_tokens": inp, "cache_read_tokens": read, "cache_write_5m_tokens": w5,
            "cache_write_1h_tokens": w1, "output_tokens": out, "reasoning_tokens": reasoning}


@pytest.fixture
def usage(bootstrap, ops_users):
    """Two teams' usage over two New York days (May 4 and 5, 2026), with every case the bill counts."""
    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(time_zone=NY)
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    alpha = make_campaign(team=research, user=ops_users["launcher"], name="alpha", model="m-1")
    beta = make_campaign(team=research, user=ops_users["launcher"], name="=beta", model="m-2")
    gamma = make_campaign(team=engineering, user=ops_users["other"], name="gamma", model="m-1")
    # 2026-05-04 10:00 New York is 14:00 UTC; 2026-05-05 02:00 UTC is still May 4th in New York.
    t1 = make_task(alpha, task_number=1, started_at=at(2026, 5, 4, 14), wallclock_s=100.25, slots=2,
                   cost_usd="0.12345678", tokens=tokens(1000, 200, 30, 4, 500, reasoning=50))
    make_task(alpha, task_number=2, started_at=at(2026, 5, 5, 2), wallclock_s=10, cost_usd="0.5",
              tokens=tokens(out=100))
    make_task(alpha, task_number=3, started_at=at(2026, 5, 5, 15), wallclock_s=7.5, cost_usd="1.25",
              tokens=tokens(inp=10, out=10))
    make_task(alpha, task_number=4, started_at=at(2026, 5, 5, 16), wallclock_s=3, cost_usd=None,
              tokens=tokens(out=9))  # unpriced
    make_task(beta, task_number=1, started_at=at(2026, 5, 4, 15), wallclock_s=60, cost_usd=None,
              tokens=tokens())  # ran, used no model: slot-hours only
    b2 = make_task(beta, task_number=2, started_at=at(2026, 5, 4, 16), wallclock_s=30, slots=4, cost_usd="2",
                   tokens=tokens(inp=7))
    AccountingRecord.objects.filter(task=b2).update(queue="classic.q")
    make_task(gamma, task_number=1, started_at=at(2026, 5, 4, 20), wallclock_s=11, cost_usd="3.3",
              tokens=tokens(inp=3, out=3))
    make_task(None, started_at=at(2026, 5, 4, 15), wallclock_s=999, project="research")  # not launched by tco
    make_task(alpha, task_number=5, started_at=at(2026, 5, 6, 14), wallclock_s=5, cost_usd="9",
              tokens=tokens(out=1))  # May 6th: outside the export
    with rollups.tasks_rolled([t1.id]):  # as the runner record's ingest stores requests: into the rollups
        ModelRequest.objects.create(task=t1, seq=1, at=at(2026, 5, 4, 14), provider="anthropic", method="POST",
                                    path="/v1/messages", status=200, model="m-1")
    return {"research": research, "engineering": engineering, "alpha": alpha, "beta": beta, "gamma": gamma}


def _days(first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 5)) -> focus.Window:
    return focus.window(first=first, last=last)


def _sum(rows, column) -> Decimal:
    return sum((Decimal(r[column]) for r in rows if r[column] != ""), Decimal(0))


def test_the_export_has_the_bills_totals_to_the_cent_and_the_second(usage):
    teams = [usage["research"], usage["engineering"]]
    rows = focus.focus_rows(teams=teams, window=_days())
    bill = bills.bill(teams=teams, period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 5))
    totals = bill["totals"]
    assert _sum(rows, "BilledCost") == totals["cost_usd"]
    assert _sum(rows, "x_WallclockSeconds") == Decimal(str(totals["wallclock_s"])).quantize(Decimal("0.001"))
    assert _sum(rows, "x_SlotSeconds") == Decimal(str(totals["slot_s"])).quantize(Decimal("0.001"))
    assert _sum(rows, "x_InputTokens") == totals["input_tokens"]
    assert _sum(rows, "x_OutputTokens") == totals["output_tokens"]
    assert _sum(rows, "x_ReasoningTokens") == totals["reasoning_tokens"]
    assert _sum(rows, "x_UnpricedTasks") == totals["unpriced_tasks"]
    # The same figures from the fixture itself, not from the bill.
    assert _sum(rows, "BilledCost") == Decimal("0.12345678") + Decimal("0.5") + Decimal("1.25") + 2 + Decimal("3.3")
    assert _sum(rows, "x_WallclockSeconds") == Decimal("100.25") + 10 + Decimal("7.5") + 3 + 60 + 30 + 11
    assert _sum(rows, "x_SlotSeconds") == Decimal("200.5") + 10 + Decimal("7.5") + 3 + 60 + 120 + 11
    token_rows = [r for r in rows if r["ConsumedUnit"] == "Tokens"]
    assert _sum(token_rows, "ConsumedQuantity") == 1734 + 100 + 20 + 9 + 7 + 6
    slot_rows = [r for r in rows if r["ConsumedUnit"] == "Slot-Hours"]
    assert _sum(slot_rows, "ConsumedQuantity") == pytest.approx(Decimal("412") / 3600, abs=Decimal("1e-8"))


def test_rows_are_per_local_day_team_campaign_and_queue(usage):
    rows = focus.focus_rows(teams=[usage["research"], usage["engineering"]], window=_days())
    alpha = usage["alpha"]
    # May 4th in New York: 04:00 UTC to 04:00 UTC the next day.
    day4 = [r for r in rows if r["ChargePeriodStart"] == "2026-05-04T04:00:00Z"]
    assert {r["ChargePeriodEnd"] for r in day4} == {"2026-05-05T04:00:00Z"}
    alpha4 = [r for r in day4 if r["x_CampaignId"] == str(alpha.pk)]
    tokens4 = [r for r in alpha4 if r["ConsumedUnit"] == "Tokens"]
    assert len(tokens4) == 1  # tasks 1 and 2: the second started 02:00 UTC on the 5th, the 4th in New York
    assert (tokens4[0]["BilledCost"], tokens4[0]["ConsumedQuantity"]) == ("0.62345678", str(1734 + 100))
    assert tokens4[0]["x_Tasks"] == "2" and tokens4[0]["PublisherName"] == "anthropic"
    assert json.loads(tokens4[0]["Tags"]) == {"tco/campaign": "alpha", "tco/campaign-id": str(alpha.pk),
                                               "tco/cluster": "dev", "tco/model": "m-1"}
    beta_slots = [r for r in day4 if r["x_CampaignName"] == "=beta" and r["ConsumedUnit"] == "Slot-Hours"]
    assert {r["x_Queue"]: r["x_SlotSeconds"] for r in beta_slots} == {"agent.q": "60", "classic.q": "120"}
    assert json.loads(beta_slots[1]["Tags"])["tco/queue"] == beta_slots[1]["x_Queue"]
    # The unpriced task is a row of its own: no cost, no unit price, counted.
    unpriced = [r for r in rows if r["x_UnpricedTasks"] not in ("", "0")]
    assert len(unpriced) == 1 and unpriced[0]["BilledCost"] == "0" and unpriced[0]["ListUnitPrice"] == ""
    assert unpriced[0]["ChargePeriodStart"] == "2026-05-05T04:00:00Z"
    # Usage tco did not launch is in no row; engineering's is its own sub-account.
    assert not [r for r in rows if r["x_WallclockSeconds"] == "999"]
    assert {r["SubAccountId"] for r in rows} == {"research", "engineering"}
    assert {r["SubAccountName"] for r in rows if r["SubAccountId"] == "engineering"} == {"engineering"}
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-05-01T04:00:00Z"}
    assert {r["BillingPeriodEnd"] for r in rows} == {"2026-06-01T04:00:00Z"}


def test_a_token_rows_unit_price_times_its_tokens_is_its_cost(usage):
    rows = focus.focus_rows(teams=[usage["research"]], window=_days())
    for row in rows:
        assert row["BilledCost"] == row["EffectiveCost"] == row["ListCost"] == row["ContractedCost"]
        if row["ListUnitPrice"]:
            product = Decimal(row["ListUnitPrice"]) * Decimal(row["PricingQuantity"])
            assert abs(product - Decimal(row["ListCost"])) < Decimal("1e-8"), row


def test_a_utc_window_cuts_the_charge_periods_at_its_edges(usage):
    rows = focus.focus_rows(teams=[usage["research"]],
                            window=focus.window(since=at(2026, 5, 4, 14, 30), until=at(2026, 5, 5, 3)))
    # Only tasks started in [14:30 on the 4th, 03:00 on the 5th) UTC: beta's two and alpha's second.
    assert {r["ChargePeriodStart"] for r in rows} == {"2026-05-04T14:30:00Z"}
    assert {r["ChargePeriodEnd"] for r in rows} == {"2026-05-05T03:00:00Z"}
    assert _sum(rows, "BilledCost") == Decimal("2.5")


def test_the_window_is_checked():
    from dashboards.core.errors import BillError

    with pytest.raises(BillError):
        focus.window(first=dt.date(2026, 5, 5), last=dt.date(2026, 5, 4))
    with pytest.raises(BillError):
        focus.window(since=at(2026, 5, 5), until=at(2026, 5, 5))
    with pytest.raises(BillError):
        focus.window(first=dt.date(2024, 1, 1), last=dt.date(2026, 1, 1))
    with pytest.raises(BillError):
        focus.window(first=dt.date(2026, 5, 5), last=dt.date(2026, 5, 6), since=at(2026, 5, 5))


def test_the_columns_are_focus_1_2s_then_tcos_own():
    assert focus.COLUMNS[:len(focus.FOCUS_COLUMNS)] == focus.FOCUS_COLUMNS
    assert all(c.startswith("x_") for c in focus.X_COLUMNS)
    assert not any(c.startswith("x_") for c in focus.FOCUS_COLUMNS)
    # The columns FOCUS 1.2 added (its CHANGELOG) and the mandatory ones the issue names.
    for column in ("BillingAccountType", "InvoiceId", "PricingCurrency", "PricingCurrencyContractedUnitPrice",
                   "PricingCurrencyEffectiveCost", "PricingCurrencyListUnitPrice", "SubAccountType",
                   "BilledCost", "EffectiveCost", "ListCost", "BillingCurrency", "ChargeCategory",
                   "ChargePeriodStart", "ChargePeriodEnd", "ConsumedQuantity", "ConsumedUnit", "PricingUnit",
                   "ServiceName", "SubAccountId", "Tags"):
        assert column in focus.FOCUS_COLUMNS


# --------------------------------------------------------------------------- the API and the bills page

def _csv(response) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return list(csv.DictReader(io.StringIO(body.decode())))


def test_the_api_exports_the_callers_teams_only(client, usage, ops_users):
    client.force_login(ops_users["lead"])
    response = client.get("/api/focus/", {"since": "2026-05-04T04:00:00Z", "until": "2026-05-06T04:00:00Z"},
                          HTTP_ACCEPT="text/csv")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/csv")
    rows = _csv(response)
    assert {r["SubAccountId"] for r in rows} == {"research"}
    assert _sum(rows, "BilledCost") == Decimal("0.12345678") + Decimal("0.5") + Decimal("1.25") + 2
    assert list(rows[0]) == list(focus.COLUMNS)
    # A campaign name that a spreadsheet would run as a formula is text in the file.
    assert "'=beta" in {r["x_CampaignName"] for r in rows}


def test_the_api_refuses_without_the_bill_role_and_checks_the_window(client, usage, ops_users):
    client.force_login(ops_users["viewer"])
    assert client.get("/api/focus/").status_code == 403
    client.force_login(ops_users["lead"])
    assert client.get("/api/focus/", {"since": "2026-05-05T00:00:00Z", "until": "2026-05-04T00:00:00Z"}
                      ).status_code == 400
    assert client.get("/api/focus/", {"since": "yesterday"}).status_code == 400


def test_the_api_schema_describes_the_export(client, usage, ops_users):
    client.force_login(ops_users["lead"])
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    text = schema.content.decode()
    assert "/api/focus/" in text and "text/csv" in text


def test_the_bills_page_links_the_focus_export_of_its_days(client, usage, ops_users):
    client.force_login(ops_users["lead"])
    query = {"period": "day", "first": "2026-05-04", "last": "2026-05-05", "group_by": "team"}
    page = client.get("/ops/bills/", query)
    assert page.status_code == 200 and b'id="bill-focus"' in page.content
    response = client.get("/ops/bills.focus.csv", query)
    assert response.status_code == 200
    rows = _csv(response)
    bill = bills.bill(teams=[usage["research"]], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 5))
    assert _sum(rows, "BilledCost") == bill["totals"]["cost_usd"]
    assert _sum(rows, "x_WallclockSeconds") == Decimal(str(bill["totals"]["wallclock_s"])).quantize(Decimal("0.001"))


# --------------------------------------------------------------------------- focus-validator

#: Column IDs that focus-validator 1.0.0's FOCUS 1.0 rules spell otherwise than the specification
#: (FOCUS 1.0 and 1.2 ``columns/*.md``: ProviderName, PublisherName, InvoiceIssuerName, ResourceId).
VALIDATOR_SPELLING = {"ProviderName": "Provider", "PublisherName": "Publisher",
                      "InvoiceIssuerName": "InvoiceIssuer", "ResourceId": "ResourceID"}
#: Its rule ``SkuPriceId_Nullable`` reads ``ChargeType``, FOCUS 0.5's name of ``ChargeCategory``
#: (renamed in 1.0-preview, CHANGELOG): the copy it checks carries the column under that name too,
#: so the rule runs (without it the rule's SQL fails and counts as a failure).
VALIDATOR_EXTRA = {"ChargeType": "ChargeCategory"}


@pytest.fixture(scope="module")
def focus_validator() -> Path:
    """The ``focus-validator`` command from its own virtual environment ``.venv-focus``, which
    scripts/setup makes from tests/focus-validator-requirements.txt (scripts/test runs scripts/setup
    first, so ``make test`` always has it). A test never builds it (a minute of pip): without it, as
    in a fresh git worktree, these tests are skipped saying so (``ln -s /path/to/main/.venv-focus``)."""
    command = REPO / ".venv-focus" / "bin" / "focus-validator"
    if not command.exists():
        pytest.skip(f"no {command}: scripts/setup makes .venv-focus (make test runs it first)")
    return command


def _validate(command: Path, path: Path, tmp_path: Path) -> tuple[int, int, list[str]]:
    """Run focus-validator on ``path`` (FOCUS 1.0 rules): ``(passed, failed, failure texts)``."""
    report = tmp_path / "report.xml"
    # It reads its currency codes from a path relative to its package's parent directory.
    site = next((command.parent.parent / "lib").glob("python3*/site-packages"))
    done = subprocess.run([str(command), "--data-file", str(path), "--validate-version", "1.0",
                           "--output-type", "unittest", "--output-destination", str(report)],
                          cwd=site, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = ElementTree.parse(report).getroot().iter("testcase")
    passed, failures = 0, []
    for case in cases:
        failed = case.find("failure")
        if failed is None:
            passed += 1
        else:
            failures.append(f"{case.get('name')}: {failed.get('message')}")
    return passed, len(failures), failures


def _validator_copy(rows: list[dict[str, str]], path: Path) -> None:
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow([VALIDATOR_SPELLING.get(c, c) for c in focus.COLUMNS] + list(VALIDATOR_EXTRA))
        for row in rows:
            out.writerow([row[c] for c in focus.COLUMNS] + [row[c] for c in VALIDATOR_EXTRA.values()])


def test_focus_validator_passes_the_export(usage, focus_validator, tmp_path):
    rows = focus.focus_rows(teams=[usage["research"], usage["engineering"]], window=_days())
    assert len(rows) >= 8
    path = tmp_path / "focus.csv"
    _validator_copy(rows, path)
    passed, failed, failures = _validate(focus_validator, path, tmp_path)
    assert failed == 0, failures
    assert passed == 133  # every rule of the validator's FOCUS 1.0 set (rules/version_sets/1.0) ran


def test_focus_validator_fails_a_broken_export(usage, focus_validator, tmp_path):
    """The check above can fail: a currency that is no ISO 4217 code, a null BilledCost and a usage row
    without a SkuPriceId are caught."""
    rows = focus.focus_rows(teams=[usage["research"]], window=_days())
    rows[0] = {**rows[0], "BillingCurrency": "DOLLARS", "BilledCost": "", "SkuPriceId": ""}
    path = tmp_path / "broken.csv"
    _validator_copy(rows, path)
    _passed, failed, failures = _validate(focus_validator, path, tmp_path)
    assert failed >= 3
    assert any("BillingCurrency" in f for f in failures) and any("BilledCost" in f for f in failures)
    assert any("SkuPriceId" in f for f in failures)
