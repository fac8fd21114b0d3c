"""Scheduler adapters by cluster flavour.

A cluster record names its flavour (``Cluster.flavour``: ``sge8`` for Son of
Grid Engine 8.1.9; ``ocs9`` for Open/Gridware Cluster Scheduler 9); the web
side asks :func:`create` for that flavour's adapter and never names an
adapter class itself.
"""
from __future__ import annotations

from typing import Any, Callable

from schedulers.base import SchedulerAdapter, SchedulerError
from schedulers.gridengine.adapter import GridEngine, OpenClusterScheduler


class UnknownFlavour(SchedulerError):
    """No adapter is registered for the flavour a cluster names."""


_ADAPTERS: dict[str, Callable[..., SchedulerAdapter]] = {}


def register(flavour: str, factory: Callable[..., SchedulerAdapter]) -> None:
    """Make ``factory`` (an adapter class, or any callable taking its keyword
    options) the adapter of ``flavour``; replaces an earlier registration."""
    if not flavour or not isinstance(flavour, str):
        raise ValueError(f"flavour {flavour!r}: a non-empty string")
    _ADAPTERS[flavour] = factory


def flavours() -> list[str]:
    """The registered flavours, sorted."""
    return sorted(_ADAPTERS)


def adapter_factory(flavour: str) -> Callable[..., SchedulerAdapter]:
    """The factory registered for ``flavour``. Raises UnknownFlavour."""
    try:
        return _ADAPTERS[flavour]
    except KeyError:
        raise UnknownFlavour(f"no scheduler adapter for flavour {flavour!r} "
                             f"(known: {', '.join(flavours()) or 'none'})") from None


def create(flavour: str, **options: Any) -> SchedulerAdapter:
    """A new adapter of ``flavour`` built with ``options`` (the adapter's keyword
    arguments: ``queues``, ``projects``, ``resources``, ``sge_root``, ``sge_cell``,
    ``accounting_path``, ``timeout``, ``notify`` …). Raises UnknownFlavour."""
    return adapter_factory(flavour)(**options)


register(GridEngine.flavour, GridEngine)
register(OpenClusterScheduler.flavour, OpenClusterScheduler)
