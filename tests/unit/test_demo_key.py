"""The demo stand-in's key survives its restart (review of 2429d30): a second `make demo` restarts the stand-in
while the first one's agents run, and their metering proxies hold the key they started with."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("django")


def test_a_kept_demo_key_is_reused_and_anything_else_replaced(tmp_path):
    from demo.stand_in import demo_key

    key_file = tmp_path / "demo-model.key"
    fresh = demo_key(key_file)  # no file yet
    assert re.fullmatch(r"sk-tco-demo-[0-9a-f]{24}", fresh)
    key_file.write_text(fresh + "\n")
    assert demo_key(key_file) == fresh
    for other in ("", "sk-tco-demo-", "sk-live-secret", fresh + "x", "sk-tco-demo-" + "G" * 24):
        key_file.write_text(other)
        new = demo_key(key_file)
        assert new != other.strip() and re.fullmatch(r"sk-tco-demo-[0-9a-f]{24}", new)
    assert demo_key(tmp_path / "missing" / "key") != demo_key(tmp_path / "missing" / "key")  # fresh each time
