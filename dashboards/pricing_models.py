"""Prices of model tokens, edited in the Django admin (DESIGN.md, "Token metering and cost").

One ``ModelPrice`` row is one model's prices from ``effective_from`` on, in
USD per million tokens per bucket, as Decimal; a price change is a new row
with a later date, so old usage keeps its old price. A bucket left empty has
no price: usage in it is flagged ``unpriced_bucket`` rather than priced at 0.
``ModelAlias`` maps another model id (e.g. a dated snapshot such as
``example-sonnet-20250929``) to a priced model name. The lookup order and the
name normalisation live in execution/metering/prices.py
(``price_table()`` below reads these tables).

Imported by dashboards/models.py, so the models belong to the ``dashboards`` app.
"""
from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models


def _price_field(bucket: str) -> models.DecimalField:
    return models.DecimalField(
        f"{bucket} (USD / 1M tokens)", max_digits=14, decimal_places=6, null=True, blank=True,
        validators=[MinValueValidator(0)], help_text="Empty: no price for this bucket.")


class ModelPrice(models.Model):
    """Prices of one model from ``effective_from`` (a UTC date) on."""

    CURRENCIES = [("USD", "US dollar")]

    model = models.CharField(max_length=200, db_index=True,
                             help_text="Model id as the API names it, e.g. example-sonnet.")
    effective_from = models.DateField(help_text="First day (UTC) these prices apply.")
    currency = models.CharField(max_length=3, choices=CURRENCIES, default="USD")
    input_per_mtok = _price_field("uncached input")
    output_per_mtok = _price_field("output")
    cache_read_per_mtok = _price_field("cache read")
    cache_write_5m_per_mtok = _price_field("cache write, 5 minutes")
    cache_write_1h_per_mtok = _price_field("cache write, 1 hour")
    note = models.CharField(max_length=255, blank=True, help_text="Where the prices come from.")

    class Meta:
        app_label = "dashboards"
        ordering = ["model", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["model", "effective_from"], name="one_price_per_model_day")]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from}"


class ModelAlias(models.Model):
    """Another name of a priced model."""

    alias = models.CharField(max_length=200, unique=True)
    model = models.CharField(max_length=200, help_text="The ModelPrice.model this alias is priced as.")

    class Meta:
        app_label = "dashboards"
        ordering = ["alias"]
        verbose_name_plural = "model aliases"

    def __str__(self) -> str:
        return f"{self.alias} -> {self.model}"


def price_table():
    """The price table as it stands in the database: an ``execution.metering.prices.PriceTable``.

    Built from every ``ModelPrice`` and ``ModelAlias`` row; the runners get the
    same table as ``<spool>/prices.json`` (``dashboards.launch.spool.prices_write``).
    """
    from execution.metering.prices import PriceTable

    return PriceTable.from_records(ModelPrice.objects.all(), ModelAlias.objects.all())
