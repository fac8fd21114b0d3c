"""One scheduler interface: every adapter implements all of it, and the registry picks by flavour."""
from __future__ import annotations


import pytest

from schedulers import registry
from schedulers.fake import FakeScheduler
from schedulers.gridengine.adapter import GridEngine

#: What tco uses of a scheduler (issue 10): if the interface loses one, this fails.
USED = {"list_tasks", "job_detail", "queue_summary", "hosts", "quotas", "global_capacity", "share_tree",
        "accounting_since", "native_specification", "submit_array", "control",
        # issue 17: advance reservations
        "reservations", "reservation_submit", "reservation_delete"}


@pytest.mark.django_db
@pytest.mark.db_independent  # the registry's choice by flavour; the database holds the cluster row only
def test_scheduler_for_reads_the_cluster_flavour(monkeypatch):
    from dashboards.core.clusters import cluster_get_default, scheduler_for

    cluster = cluster_get_default()
    assert type(scheduler_for(cluster)) is GridEngine
    built = []

    def factory(**options):
        built.append(options)
        return FakeScheduler()

    monkeypatch.setattr(registry, "_ADAPTERS", dict(registry._ADAPTERS))
    registry.register("testfl", factory)
    cluster.flavour = "testfl"
    assert isinstance(scheduler_for(cluster, timeout=2.5), FakeScheduler)
    assert built[0]["timeout"] == 2.5 and built[0]["sge_root"] == cluster.sge_root
    cluster.flavour = "nonesuch"
    with pytest.raises(registry.UnknownFlavour):
        scheduler_for(cluster)
