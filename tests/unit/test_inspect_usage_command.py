"""``manage.py inspect usage`` prints the issue's JSON object for a captured response."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"
KEYS = ["provider", "model", "input_tokens", "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
        "output_tokens", "reasoning_tokens", "complete", "cost_usd", "flags"]


def run(*args: str) -> dict:
    out = io.StringIO()
    call_command("inspect", "usage", *args, stdout=out)
    return json.loads(out.getvalue())


def test_it_reads_the_openai_usage_chunk_with_empty_choices():
    got = run(str(CASES / "BUG-11_openai_usage_chunk" / "stream.sse"),
              "--prices", str(CASES / "prices_hypothetical.json"))
    assert list(got) == KEYS
    # 1500 prompt tokens of which 1280 cached: 220 uncached; 180 output of which 64 reasoning.
    assert (got["input_tokens"], got["cache_read_tokens"], got["output_tokens"], got["reasoning_tokens"]) == (
        220, 1280, 180, 64)
    assert got["cost_usd"] == "0.00252" and got["complete"] is True and got["flags"] == []


def test_an_unknown_model_is_flagged_and_not_priced_at_zero(tmp_path):
    body = {"id": "msg_1", "type": "message", "model": "nobody-knows-this-model", "role": "assistant",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 5}}
    path = tmp_path / "resp.json"
    path.write_text(json.dumps(body))
    got = run(str(path), "--prices", str(CASES / "prices_hypothetical.json"))
    assert got["cost_usd"] is None and "unpriced_model" in got["flags"]
    assert got["input_tokens"] == 10 and got["output_tokens"] == 5


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run(str(tmp_path / "nope.json"))
