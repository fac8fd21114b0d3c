"""One scheduler interface: every adapter implements all of it, and the registry picks by flavour."""
from __future__ import annotations

import inspect

import pytest

from schedulers import registry
from schedulers.base import SchedulerAdapter, abstract_methods
from schedulers.fake import FakeScheduler
from schedulers.gridengine.adapter import GridEngine

#: What tco uses of a scheduler (issue 10): if the interface loses one, this fails.
USED = {"list_tasks", "job_detail", "queue_summary", "hosts", "quotas", "global_capacity", "share_tree",
        "accounting_since", "native_specification", "submit_array", "control",
        # issue 17: advance reservations
        "reservations", "reservation_submit", "reservation_delete"}


def test_the_interface_declares_everything_tco_uses():
    assert abstract_methods(SchedulerAdapter) == USED


@pytest.mark.parametrize("adapter", [GridEngine, FakeScheduler])
def test_every_adapter_implements_every_interface_method(adapter):
    assert issubclass(adapter, SchedulerAdapter)
    assert abstract_methods(adapter) == set()
    adapter()  # instantiable: an ABC with an abstract method left would raise TypeError
    for name in USED:
        declared = inspect.signature(getattr(SchedulerAdapter, name))
        implemented = inspect.signature(getattr(adapter, name))
        assert list(implemented.parameters) == list(declared.parameters), name


def test_an_adapter_missing_a_method_cannot_be_built():
    class Partial(FakeScheduler):
        pass

    del_name = "share_tree"
    Partial.share_tree = SchedulerAdapter.share_tree  # the abstract declaration
    Partial.__abstractmethods__ = frozenset({del_name})
    with pytest.raises(TypeError, match=del_name):
        Partial()


def test_the_registry_picks_the_adapter_by_flavour():
    assert "sge8" in registry.flavours()
    engine = registry.create("sge8", sge_root="/x", sge_cell="c", queues=["agent.q"])
    assert type(engine) is GridEngine and engine.sge_root == "/x" and engine.queues == {"agent.q"}
    assert engine.accounting_path == "/x/c/common/accounting"
    with pytest.raises(registry.UnknownFlavour, match="pbs"):
        registry.create("pbs")
