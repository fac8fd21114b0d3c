"""``manage.py inspect usage``'s object (execution/metering/inspect_usage.py) on the usage cases."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from execution.metering.inspect_usage import KEYS, inspect_usage

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"
PRICES = CASES / "prices_hypothetical.json"


def test_bug11_openai_stream():
    out = inspect_usage(CASES / "BUG-11_openai_usage_chunk" / "stream.sse", PRICES)
    assert out == {"provider": "openai", "model": "example-openai-model", "input_tokens": 220,
                   "cache_read_tokens": 1280, "cache_write_5m_tokens": 0, "cache_write_1h_tokens": 0,
                   "output_tokens": 180, "reasoning_tokens": 64, "complete": True, "cost_usd": "0.00252",
                   "flags": []}
    assert tuple(out) == KEYS == ("provider", "model", "input_tokens", "cache_read_tokens", "cache_write_5m_tokens",
                                  "cache_write_1h_tokens", "output_tokens", "reasoning_tokens", "complete",
                                  "cost_usd", "flags")
    json.dumps(out)  # printable as one JSON object


@pytest.mark.parametrize("name,input_tokens,cache_read,output,cost", [
    ("stream_a_output_only_delta.sse", 25, 0, 15, "0.0003"),         # 25*3e-6 + 15*15e-6
    ("stream_b_delta_repeats_input.sse", 27, 2048, 47, "0.0014004"),  # the case's own figure
    ("stream_c_two_deltas.sse", 1800, 0, 310, "0.01005"),            # 1800*3e-6 + 310*15e-6
])
def test_bug12_anthropic_streams(name, input_tokens, cache_read, output, cost):
    out = inspect_usage(CASES / "BUG-12_anthropic_cumulative_delta" / name, PRICES)
    assert out["provider"] == "anthropic" and out["model"] == "example-sonnet"
    assert (out["input_tokens"], out["cache_read_tokens"], out["output_tokens"]) == (input_tokens, cache_read, output)
    assert out["cost_usd"] == cost and out["complete"] is True and out["flags"] == []


def test_bug15_split_stream_capture():
    out = inspect_usage(CASES / "BUG-15_sse_chunk_split" / "whole_stream.sse", PRICES)
    # 321*3e-6 + 1024*0.3e-6 + 12*15e-6 = 0.000963 + 0.0003072 + 0.00018
    assert (out["input_tokens"], out["cache_read_tokens"], out["output_tokens"]) == (321, 1024, 12)
    assert out["cost_usd"] == "0.0014502"


def test_json_body_with_requested_model(tmp_path):
    body = {"id": "chatcmpl-1", "object": "chat.completion", "model": "example-openai-model:2024-07-21-v2",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}
    path = tmp_path / "body.json"
    path.write_text(json.dumps(body, indent=2))
    out = inspect_usage(path, PRICES, requested_model="example-openai-model")
    assert out["cost_usd"] == "0.00028" and out["flags"] == ["response_model_unknown"]
    unpriced = inspect_usage(path, PRICES)
    assert unpriced["cost_usd"] is None and unpriced["flags"] == ["unpriced_model"]
    assert unpriced["input_tokens"] == 100 and unpriced["output_tokens"] == 10


def test_anthropic_json_body_with_ttl_split_and_alias(tmp_path):
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "example-sonnet-20250929",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 3000,
                      "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000}}}
    path = tmp_path / "msg.json"
    path.write_text(json.dumps(body))
    out = inspect_usage(path, PRICES)
    assert (out["cache_write_5m_tokens"], out["cache_write_1h_tokens"]) == (1000, 2000)
    # 10*3e-6 + 1000*3.75e-6 + 2000*6e-6 + 20*15e-6
    assert out["cost_usd"] == "0.01608"
    assert out["flags"] == []


def test_without_prices_the_cost_is_null_and_flagged():
    out = inspect_usage(CASES / "BUG-11_openai_usage_chunk" / "stream.sse")
    assert out["cost_usd"] is None and out["flags"] == ["unpriced_model"]
    assert out["input_tokens"] == 220


def test_truncated_capture_is_incomplete(tmp_path):
    whole = (CASES / "BUG-15_sse_chunk_split" / "whole_stream.sse").read_bytes()
    path = tmp_path / "cut.sse"
    path.write_bytes(whole[:whole.index(b"event: message_delta")])
    out = inspect_usage(path, PRICES)
    assert out["complete"] is False
    assert out["flags"] == ["output_estimated", "incomplete"]
    assert (out["input_tokens"], out["cache_read_tokens"], out["output_tokens"]) == (321, 1024, 4)  # 13 bytes


def test_missing_file_raises():
    with pytest.raises(OSError):
        inspect_usage(CASES / "no-such-file.sse")
