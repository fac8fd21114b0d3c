"""The admins' per-queue and per-agent sandbox limits (``TCO_QUEUE_SANDBOX_LIMITS``,
``TCO_AGENT_SANDBOX_LIMITS``; docs/limits.md) are parsed strictly: a malformed table stops start-up
with a message naming the setting, never a ceiling silently dropped."""
from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboards.core import limits
from tco_web.limit_settings import sandbox_limit_table

GIB, MIB = 1 << 30, 1 << 20


def test_a_table_of_ceilings_and_defaults_is_read_as_bytes():
    raw = '{"agent.q": {"memory_bytes": {"max": 2147483648, "default": 1073741824}}, "classic.q": {"work_bytes": {"max": 1048576}}}'
    assert sandbox_limit_table("T", raw) == {"agent.q": {"memory_bytes": {"max": 2 * GIB, "default": GIB}},
                                             "classic.q": {"work_bytes": {"max": MIB}}}
    assert sandbox_limit_table("T", "") == {} and sandbox_limit_table("T", None) == {} and sandbox_limit_table("T", " ") == {}


def test_its_limits_and_minima_are_the_launch_forms():
    """The settings module cannot import core.limits: its copy of the keys and minima must agree."""
    for key, least in limits.LAUNCH_SANDBOX_MINIMA.items():
        assert sandbox_limit_table("T", f'{{"q": {{"{key}": {{"max": {least}}}}}}}') == {"q": {key: {"max": least}}}
        with pytest.raises(ImproperlyConfigured, match="at least"):
            sandbox_limit_table("T", f'{{"q": {{"{key}": {{"max": {least - 1}}}}}}}')
    assert set(limits.LAUNCH_SANDBOX_MINIMA) == set(limits.LAUNCH_SANDBOX_LIMITS)


@pytest.mark.parametrize("raw, words", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON object"),
    ('{"agent.q": 4}', "an object of limits"),
    ('{"agent.q": {"cpu_s": {"max": 100}}}', "is not memory_bytes or work_bytes"),
    ('{"agent.q": {"memory_bytes": 2147483648}}', "an object with max and/or default"),
    ('{"agent.q": {"memory_bytes": {}}}', "an object with max and/or default"),
    ('{"agent.q": {"memory_bytes": {"max": 2147483648, "min": 1}}}', "an object with max and/or default"),
    ('{"agent.q": {"memory_bytes": {"max": true}}}', "a whole number of bytes"),
    ('{"agent.q": {"memory_bytes": {"max": 2147483648.0}}}', "a whole number of bytes"),
    ('{"agent.q": {"memory_bytes": {"max": "2G"}}}', "a whole number of bytes"),
    ('{"agent.q": {"memory_bytes": {"max": 1073741824, "default": 2147483648}}}', "default above max"),
])
def test_a_malformed_table_stops_start_up_naming_the_setting(raw, words):
    with pytest.raises(ImproperlyConfigured, match=words) as caught:
        sandbox_limit_table("TCO_QUEUE_SANDBOX_LIMITS", raw)
    assert str(caught.value).startswith("TCO_QUEUE_SANDBOX_LIMITS: ")


def test_the_ceiling_is_the_smallest_of_site_queue_and_agent_and_the_default_stays_under_it(settings):
    settings.TCO_SANDBOX_LIMITS = {"TCO_SANDBOX_MEMORY_BYTES": str(4 * GIB), "TCO_SANDBOX_WORK_BYTES": str(8 * GIB)}
    settings.TCO_QUEUE_SANDBOX_LIMITS = {"agent.q": {"memory_bytes": {"max": 2 * GIB, "default": GIB}},
                                         "classic.q": {"memory_bytes": {"default": 3 * GIB}}}
    settings.TCO_AGENT_SANDBOX_LIMITS = {"solver": {"memory_bytes": {"max": 1536 * MIB, "default": 512 * MIB},
                                                    "work_bytes": {"max": 2 * GIB}}}
    assert limits.sandbox_ceiling("agent.q", "demo-agent") == {
        "memory_bytes": {"max": 2 * GIB, "default": GIB, "by": "the queue agent.q's ceiling"},
        "work_bytes": {"max": 8 * GIB, "default": 8 * GIB, "by": "the site's maximum"}}
    assert limits.sandbox_ceiling("agent.q", "solver") == {
        "memory_bytes": {"max": 1536 * MIB, "default": 512 * MIB, "by": "the agent solver's ceiling"},
        "work_bytes": {"max": 2 * GIB, "default": 2 * GIB, "by": "the agent solver's ceiling"}}
    # A default alone (no ceiling of its own) is what a blank limit gets; never above the ceiling.
    assert limits.sandbox_ceiling("classic.q", "demo-agent")["memory_bytes"] == {
        "max": 4 * GIB, "default": 3 * GIB, "by": "the site's maximum"}
    assert limits.sandbox_ceiling("classic.q", "solver")["memory_bytes"] == {
        "max": 1536 * MIB, "default": 512 * MIB, "by": "the agent solver's ceiling"}
    settings.TCO_AGENT_SANDBOX_LIMITS = {"solver": {"memory_bytes": {"max": 1536 * MIB}}}
    assert limits.sandbox_ceiling("classic.q", "solver")["memory_bytes"]["default"] == 1536 * MIB
    # Nothing set by admins: the site's values, as before.
    settings.TCO_QUEUE_SANDBOX_LIMITS, settings.TCO_AGENT_SANDBOX_LIMITS = {}, {}
    assert limits.sandbox_ceiling("agent.q", "solver")["work_bytes"] == {
        "max": 8 * GIB, "default": 8 * GIB, "by": "the site's maximum"}
