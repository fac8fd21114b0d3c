"""Admin for the price table (dashboards/pricing_models.py); imported by dashboards/admin.py."""
from django.contrib import admin

from dashboards.pricing_models import ModelAlias, ModelPrice


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = ("model", "effective_from", "currency", "input_per_mtok", "output_per_mtok",
                    "cache_read_per_mtok", "cache_write_5m_per_mtok", "cache_write_1h_per_mtok")
    list_filter = ("model",)
    search_fields = ("model",)
    date_hierarchy = "effective_from"


@admin.register(ModelAlias)
class ModelAliasAdmin(admin.ModelAdmin):
    list_display = ("alias", "model")
    search_fields = ("alias", "model")
