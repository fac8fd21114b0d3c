"""Price table: case BUG-18 (model names the table does not know), dates, Decimal, the admin models."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from execution.metering.prices import PriceTable
from execution.metering.usage import Usage



@pytest.mark.django_db
def test_the_runners_prices_file_is_the_table_the_forecast_prices_with(settings, tmp_path):
    """One price source: a model priced only in TCO_PRICES was forecast with a price but the
    runners' prices.json (database only) left it unpriced, so forecast and bill disagreed."""
    from dashboards.billing.costs import price_table
    from dashboards.launch.spool import prices_write
    from dashboards.pricing_models import ModelPrice

    settings.TCO_SPOOL_DIR = str(tmp_path)
    settings.TCO_PRICES = {"settings-model": {"input": 3, "output": 15}}
    ModelPrice.objects.create(model="db-model", input_per_mtok=Decimal("1"), output_per_mtok=Decimal("2"),
                              effective_from=dt.date(2026, 1, 1))
    written = PriceTable.from_file(prices_write())
    usage = Usage(model="settings-model", input_tokens=1_000_000, output_tokens=1_000_000)
    assert written.price(usage).cost_usd == Decimal("18")  # $3 + $15 per million, from TCO_PRICES
    db_usage = Usage(model="db-model", input_tokens=1_000_000, output_tokens=0)
    assert written.price(db_usage).cost_usd == Decimal("1")
    assert written.to_mapping() == price_table().to_mapping()


@pytest.mark.django_db
def test_no_price_anywhere_writes_no_prices_file(settings, tmp_path):
    from dashboards.launch.spool import prices_write

    settings.TCO_SPOOL_DIR = str(tmp_path)
    settings.TCO_PRICES = {}
    assert prices_write() is None
    assert not (tmp_path / "prices.json").exists()
