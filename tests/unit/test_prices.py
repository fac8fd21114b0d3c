"""Price table: case BUG-18 (model names the table does not know), dates, Decimal, the admin models."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest

from execution.metering.prices import (BillTotals, PriceTable, PriceTableError, format_usd, normalise_model_name)
from execution.metering.usage import Usage, usage_from_usage_object

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"
BUG18 = CASES / "BUG-18_unpriced_model_names"


@pytest.fixture(scope="module")
def bug18_table() -> PriceTable:
    """The hypothetical prices without their own aliases, plus BUG-18's aliases.json."""
    data = json.loads((CASES / "prices_hypothetical.json").read_text())
    data["aliases"] = json.loads((BUG18 / "aliases.json").read_text())
    return PriceTable.from_mapping(data)


def bug18_requests() -> list[dict]:
    return [json.loads(line) for line in (BUG18 / "observed_requests.jsonl").read_text().splitlines() if line]


def price_request(table: PriceTable, req: dict):
    usage = usage_from_usage_object(req["usage"], model=req["response_model"])
    return usage, table.price(usage, req["requested_model"])


@pytest.mark.parametrize("req", bug18_requests(), ids=lambda r: r["req"])
def test_bug18_each_request_priced_as_expected(bug18_table, req):
    expected = json.loads((BUG18 / "expected.json").read_text())["results"][req["req"]]
    usage, result = price_request(bug18_table, req)
    assert result.priced_as == expected["priced_as"]
    if expected["cost_usd"] is None:
        assert result.cost_usd is None
    else:
        assert result.cost_text == expected["cost_usd"].split("=")[-1].strip()
    if "flag" in expected:
        assert expected["flag"] in result.flags
    else:
        assert result.flags == []
    assert (usage.input_tokens, usage.output_tokens) == (100, 10)  # tokens are recorded even when unpriced


def test_bug18_key_numbers_and_lookup_steps(bug18_table):
    results = {r["req"]: price_request(bug18_table, r)[1] for r in bug18_requests()}
    assert (results["r1"].via, results["r1"].cost_usd) == ("alias", Decimal("0.00045"))
    assert (results["r2"].via, results["r2"].cost_usd) == ("requested_model", Decimal("0.00028"))
    assert results["r2"].flags == ["response_model_unknown"]
    assert (results["r3"].via, results["r3"].flags) == ("normalised", ["response_model_unknown"])
    assert (results["r4"].via, results["r4"].flags) == ("response_model", [])
    assert (results["r5"].cost_usd, results["r5"].flags) == (None, ["unpriced_model"])


def test_bug18_alias_comes_from_the_aliases_file(bug18_table):
    data = json.loads((CASES / "prices_hypothetical.json").read_text())
    data.pop("aliases")
    without = PriceTable.from_mapping(data)
    r1 = bug18_requests()[0]
    assert price_request(without, r1)[1].via == "requested_model"  # falls through to step 3
    assert price_request(bug18_table, r1)[1].via == "alias"


def test_bug18_team_report_shows_priced_total_and_an_unpriced_line(bug18_table):
    expected = json.loads((BUG18 / "expected.json").read_text())
    bill = BillTotals()
    for req in bug18_requests():
        usage, result = price_request(bug18_table, req)
        bill.add(usage, result, req["requested_model"])
    assert bill.cost_usd == Decimal("0.00163")
    assert bill.unpriced_line() == "110 tokens on 1 unpriced model (totally-unknown-model)"
    assert "0.00163" in expected["team_report_must_show"] and bill.unpriced_line() in expected["team_report_must_show"]
    assert bill.to_dict()["cost_usd"] == "0.00163" and bill.to_dict()["unpriced_tokens"] == 110


def test_a_date_suffix_is_not_guessed_away(bug18_table):
    usage = Usage(model="example-sonnet-20991231", input_tokens=100, output_tokens=10)
    result = bug18_table.price(usage)
    assert result.cost_usd is None and result.flags == ["unpriced_model"]


def test_normalisation_is_case_and_known_provider_prefix_only(bug18_table):
    assert normalise_model_name("  Anthropic/Example-Sonnet ") == "example-sonnet"
    assert normalise_model_name("openai:example-openai-model") == "example-openai-model"
    assert normalise_model_name("vendorx/example-sonnet") == "vendorx/example-sonnet"
    assert bug18_table.resolve(None, "ANTHROPIC/example-sonnet") == ("example-sonnet", "normalised")
    assert bug18_table.resolve("openai/example-openai-model", None) == ("example-openai-model", "normalised")
    assert bug18_table.resolve(None, "vendorx/example-sonnet") == (None, None)


def test_unknown_model_is_never_priced_at_zero_and_never_raises(bug18_table):
    for model in (None, "", "totally-unknown-model"):
        result = bug18_table.price(Usage(model=model, input_tokens=5), requested_model=None)
        assert result.cost_usd is None and "unpriced_model" in result.flags


def test_missing_bucket_price_makes_the_cost_unknown_not_zero():
    table = PriceTable.from_file(CASES / "prices_hypothetical.json")
    usage = Usage(model="example-openai-model", input_tokens=100, cache_write_1h_tokens=50)
    result = table.price(usage)
    assert result.cost_usd is None and result.flags == ["unpriced_bucket"]
    assert table.price(Usage(model="example-openai-model", input_tokens=100)).cost_usd == Decimal("0.0002")


def test_effective_dates_pick_the_price_in_force():
    table = PriceTable.from_mapping({"m": [
        {"effective_from": "2025-01-01", "input": "1", "output": "2"},
        {"effective_from": "2025-06-01", "input": "10", "output": "20"},
    ]})
    usage = Usage(model="m", input_tokens=1_000_000)
    assert table.price(usage, at=dt.date(2025, 5, 31)).cost_usd == Decimal("1")
    assert table.price(usage, at=dt.date(2025, 6, 1)).cost_usd == Decimal("10")
    assert table.price(usage, at=dt.datetime(2025, 6, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
                       ).cost_usd == Decimal("1")  # 2025-05-31 22:30 UTC
    assert table.price(usage).cost_usd == Decimal("10")  # no date: the latest
    early = table.price(usage, at=dt.date(2024, 12, 31))
    assert early.cost_usd is None and early.flags == ["unpriced_model"] and early.priced_as == "m"


def test_prices_are_exact_decimals():
    table = PriceTable.from_file(CASES / "prices_hypothetical.json")
    rate = table.rate_for("example-sonnet")
    assert rate.cache_read == Decimal("0.3") and isinstance(rate.input, Decimal)
    usage = Usage(model="example-sonnet", cache_read_tokens=3, input_tokens=1, output_tokens=1)
    # 3 * 0.3e-6 + 3e-6 + 15e-6: with floats this is 1.8899999999999998e-05
    assert table.price(usage).cost_usd == Decimal("0.0000189")
    assert table.price(usage).cost_text == "0.0000189"


def test_format_usd():
    assert format_usd(Decimal("0.002520")) == "0.00252"
    assert format_usd(Decimal("0E-12")) == "0"
    assert format_usd(Decimal("12.50")) == "12.5"
    assert format_usd(Decimal("1E-9")) == "0.000000001"


@pytest.mark.parametrize("bad", [{"m": {"input": -1}}, {"m": {"input": "abc"}}, {"m": {"inptu": 1}},
                                 {"m": {"input": 1, "currency": "EUR"}}, {"m": {"effective_from": "June"}},
                                 {"aliases": {"a": 1}}, {"m": 3}])
def test_malformed_prices_are_refused(bad):
    with pytest.raises(PriceTableError):
        PriceTable.from_mapping(bad)


def test_prices_file_must_be_json(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text("{not json")
    with pytest.raises(PriceTableError):
        PriceTable.from_file(path)


def test_table_from_django_model_instances():
    from dashboards.pricing_models import ModelAlias, ModelPrice

    prices = [ModelPrice(model="example-sonnet", effective_from=dt.date(2025, 1, 1), input_per_mtok=Decimal("3"),
                         output_per_mtok=Decimal("15"), cache_read_per_mtok=Decimal("0.3"),
                         cache_write_5m_per_mtok=Decimal("3.75"), cache_write_1h_per_mtok=None)]
    aliases = [ModelAlias(alias="example-sonnet-20250929", model="example-sonnet")]
    table = PriceTable.from_records(prices, aliases)
    usage = Usage(model="example-sonnet-20250929", input_tokens=100, output_tokens=10)
    result = table.price(usage, at=dt.date(2025, 3, 1))
    assert (result.priced_as, result.via, result.cost_usd) == ("example-sonnet", "alias", Decimal("0.00045"))
    assert table.price(Usage(model="example-sonnet", cache_write_1h_tokens=1)).flags == ["unpriced_bucket"]
    assert ModelPrice._meta.app_label == "dashboards"
    assert ModelPrice._meta.get_field("input_per_mtok").decimal_places == 6


def test_table_round_trips_through_the_file_format(tmp_path):
    table = PriceTable.from_mapping({"m": [{"effective_from": "2025-01-01", "input": "1.5"},
                                           {"effective_from": "2025-06-01", "input": "2", "cache_write_1h": "0.1"}],
                                     "aliases": {"m-1": "m"}})
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(table.to_mapping()))
    again = PriceTable.from_file(path)
    assert again.to_mapping() == table.to_mapping()
    assert again.rate_for("m", dt.date(2025, 2, 1)).input == Decimal("1.5")
    assert again.rate_for("m").cache_write_1h == Decimal("0.1") and again.aliases == {"m-1": "m"}
