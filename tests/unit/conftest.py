"""The unit tests' live store: in this process's memory, the producer run at each wake-up
(core.live_bus.MemoryBus), emptied before each test."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def live_store_in_memory(settings):
    from dashboards.core import live_bus

    settings.TCO_LIVE_BUS = "memory"
    live_bus.MEMORY.reset()
    live_bus.MEMORY.eager = True
    yield live_bus.MEMORY
    live_bus.MEMORY.reset()
