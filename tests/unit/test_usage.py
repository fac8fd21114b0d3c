"""Usage extraction: cases BUG-11, BUG-12, BUG-15 and each kind of fault of issue 5."""
from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path

import pytest

from execution.metering.prices import PriceTable
from execution.metering.sse import SSEDecoder
from execution.metering.usage import Usage, detect_api, estimate_request_input_tokens, usage_from_usage_object
from execution.metering.usage_file import append_usage_file, usage_file_lines
from execution.metering.usage_readers import StreamUsageReader, usage_from_json, usage_from_sse

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"
BUG11 = CASES / "BUG-11_openai_usage_chunk"
BUG12 = CASES / "BUG-12_anthropic_cumulative_delta"
BUG15 = CASES / "BUG-15_sse_chunk_split"


@pytest.fixture(scope="module")
def prices() -> PriceTable:
    return PriceTable.from_file(CASES / "prices_hypothetical.json")


def buckets(usage: Usage) -> dict:
    return {"input": usage.input_tokens, "cache_read": usage.cache_read_tokens,
            "cache_write_5m": usage.cache_write_5m_tokens, "cache_write_1h": usage.cache_write_1h_tokens,
            "output": usage.output_tokens, "reasoning": usage.reasoning_tokens}


def sse(*events: tuple[str | None, dict | str]) -> bytes:
    """Build an SSE stream: (event name or None, data object or raw string)."""
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    return "".join(out).encode("utf-8")


# --------------------------------------------------------------------- BUG-11


def test_bug11_usage_in_last_chunk_with_empty_choices_is_read(prices):
    expected = json.loads((BUG11 / "expected.json").read_text())
    usage = usage_from_sse((BUG11 / "stream.sse").read_bytes())
    assert buckets(usage) == {
        "input": expected["buckets"]["input_uncached"], "cache_read": expected["buckets"]["cache_read"],
        "cache_write_5m": 0, "cache_write_1h": 0, "output": expected["buckets"]["output"],
        "reasoning": expected["buckets"]["reasoning_part_of_output"]}
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens, usage.reasoning_tokens) == (
        220, 1280, 180, 64)
    assert usage.provider == "openai" and usage.api == "chat.completions"
    assert usage.model == "example-openai-model"
    assert usage.complete is True and usage.flags == []
    # reasoning is part of output: the disjoint total equals the API's total_tokens
    assert usage.total_tokens == expected["usage"]["total_tokens"] == 1680
    assert prices.price(usage).cost_usd == Decimal("0.00252")


def test_bug11_stream_without_usage_is_flagged_and_estimated_not_zero():
    whole = (BUG11 / "stream.sse").read_bytes()
    events = whole.split(b"\n\n")
    without_usage = b"\n\n".join(e for e in events if b'"choices":[]' not in e)
    assert without_usage != whole
    usage = usage_from_sse(without_usage)
    assert "usage_missing" in usage.flags and "output_estimated" in usage.flags
    assert usage.complete is True  # [DONE] arrived: the stream is whole, only the usage is unknown
    # "Hello, world." is 13 bytes -> ceil(13 / 4) = 4 tokens, not 0
    assert usage.output_tokens == 4
    assert usage.estimate_basis_bytes == 13


def test_bug11_input_estimated_from_request_text_when_usage_missing():
    reader = StreamUsageReader("chat.completions", request={"model": "m", "messages": [
        {"role": "user", "content": "x" * 400},
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "data:image/png;base64," + "A" * 9000}}]},
    ]})
    reader.feed(sse((None, {"object": "chat.completion.chunk", "model": "m",
                            "choices": [{"index": 0, "delta": {"content": "abcdefgh"}}]}), (None, "[DONE]")))
    usage = reader.finish()
    assert usage.input_tokens == 100  # 400 bytes of text; the base64 image is not text
    assert usage.output_tokens == 2
    assert usage.flags == ["usage_missing", "output_estimated"]


# --------------------------------------------------------------------- BUG-12


@pytest.mark.parametrize("name", ["stream_a_output_only_delta.sse", "stream_b_delta_repeats_input.sse",
                                  "stream_c_two_deltas.sse"])
def test_bug12_message_delta_usage_is_cumulative_never_summed(name):
    expected = json.loads((BUG12 / "expected.json").read_text())[name]
    usage = usage_from_sse((BUG12 / name).read_bytes())
    assert usage.input_tokens == expected["input_tokens"]
    assert usage.output_tokens == expected["output_tokens"]
    if "cache_read_input_tokens" in expected:
        assert usage.cache_read_tokens == expected["cache_read_input_tokens"]
        assert usage.cache_write_5m_tokens + usage.cache_write_1h_tokens == expected["cache_creation_input_tokens"]
    for key, wrong in expected.get("wrong_if_summed", {}).items():
        field = "cache_read_tokens" if key == "cache_read_input_tokens" else key
        assert getattr(usage, field) != wrong
    assert usage.complete is True and usage.flags == []


def test_bug12_key_numbers():
    a = usage_from_sse((BUG12 / "stream_a_output_only_delta.sse").read_bytes())
    b = usage_from_sse((BUG12 / "stream_b_delta_repeats_input.sse").read_bytes())
    c = usage_from_sse((BUG12 / "stream_c_two_deltas.sse").read_bytes())
    assert (a.input_tokens, a.output_tokens) == (25, 15)
    assert (b.input_tokens, b.cache_read_tokens, b.output_tokens) == (27, 2048, 47)
    assert (c.input_tokens, c.output_tokens) == (1800, 310)


def test_bug12_stream_b_cost(prices):
    usage = usage_from_sse((BUG12 / "stream_b_delta_repeats_input.sse").read_bytes())
    assert prices.price(usage).cost_usd == Decimal("0.0014004")


# --------------------------------------------------------------------- BUG-15


def network_chunks() -> list[bytes]:
    data = json.loads((BUG15 / "network_chunks.json").read_text())
    return [base64.b64decode(c) for c in data["chunks"]]


def test_bug15_chunks_rebuild_the_whole_stream():
    assert b"".join(network_chunks()) == (BUG15 / "whole_stream.sse").read_bytes()


def test_bug15_split_reads_give_the_same_events_and_usage_as_the_whole_stream():
    expected = json.loads((BUG15 / "expected.json").read_text())
    decoder = SSEDecoder()
    events = []
    for chunk in network_chunks():
        events += decoder.feed(chunk)
    events += decoder.close()
    assert [e.event for e in events] == expected["events_in_order"]
    text = json.loads(events[2].data)["delta"]["text"]
    assert text == expected["text"] == "Café 😀 ok"
    assert "\ufffd" not in "".join(e.data for e in events)
    usage = usage_from_sse(network_chunks())
    assert usage == usage_from_sse((BUG15 / "whole_stream.sse").read_bytes())
    assert usage.input_tokens == expected["usage"]["input_tokens"] == 321
    assert usage.cache_read_tokens == expected["usage"]["cache_read_input_tokens"] == 1024
    assert usage.output_tokens == expected["usage"]["output_tokens"] == 12
    assert usage.complete is True and usage.flags == []


def test_bug15_every_split_point_and_single_bytes_give_the_same_usage():
    whole = (BUG15 / "whole_stream.sse").read_bytes()
    reference = usage_from_sse(whole)
    for cut in range(1, len(whole)):
        assert usage_from_sse([whole[:cut], whole[cut:]]) == reference, cut
    assert usage_from_sse([whole[i:i + 1] for i in range(len(whole))]) == reference


def test_bug15_every_split_point_of_an_openai_stream():
    whole = (BUG11 / "stream.sse").read_bytes().replace(b"\n", b"\r\n")
    reference = usage_from_sse(whole)
    assert (reference.input_tokens, reference.output_tokens) == (220, 180)
    for cut in range(1, len(whole)):
        assert usage_from_sse([whole[:cut], whole[cut:]]) == reference, cut


# ----------------------------------------------------------------- SSE decoder


def decode(*chunks: bytes):
    decoder = SSEDecoder()
    events = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def test_sse_line_endings_crlf_cr_and_lf_are_all_line_ends():
    for sep in (b"\n", b"\r\n", b"\r"):
        events = decode(b"event: a" + sep + b"data: 1" + sep + sep + b"data: 2" + sep + sep)
        assert [(e.event, e.data) for e in events] == [("a", "1"), ("message", "2")], sep


def test_sse_cr_at_the_end_of_a_read_waits_for_its_lf():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\r") == []
    assert decoder.feed(b"\n") == []  # CRLF is one line end, not a line end and a blank line
    assert [e.data for e in decoder.feed(b"\r\n")] == ["1"]


def test_sse_multi_line_data_comments_id_and_no_space_after_colon():
    events = decode(b": keep-alive comment\nid: 7\nevent:x\ndata:first\ndata:  second\nunknown: y\n\n")
    assert len(events) == 1
    assert events[0].event == "x" and events[0].id == "7"
    assert events[0].data == "first\n second"  # one leading space removed, not two


def test_sse_event_without_data_is_not_dispatched_and_bom_is_dropped():
    events = decode(b"\xef\xbb", b"\xbfevent: ping\n\n", b"data: x\n\n")
    assert [(e.event, e.data) for e in events] == [("message", "x")]


def test_sse_last_event_without_blank_line_is_dispatched_at_close():
    assert [e.data for e in decode(b"data: tail")] == ["tail"]


def test_sse_invalid_utf8_is_replaced_not_raised():
    assert decode(b"data: \xff\xfe ok\n\n")[0].data == "\ufffd\ufffd ok"


# ------------------------------------------------- streaming vs non-streaming


ANTHROPIC_USAGE = {"input_tokens": 50, "cache_read_input_tokens": 4000, "cache_creation_input_tokens": 3000,
                   "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
                   "output_tokens": 75}


def anthropic_stream(final_usage: dict | None = None, stop: bool = True) -> bytes:
    start_usage = {**ANTHROPIC_USAGE, "output_tokens": 1}
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "example-sonnet", "content": [],
            "usage": start_usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "x" * 40}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]
    if final_usage is not None:
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                         "usage": final_usage}))
    if stop:
        events.append(("message_stop", {"type": "message_stop"}))
    return sse(*events)


def test_cache_fields_only_in_message_start_survive_streaming_as_in_json():
    body = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "example-sonnet",
                       "content": [{"type": "text", "text": "x" * 40}], "usage": ANTHROPIC_USAGE})
    from_json = usage_from_json(body)
    from_stream = usage_from_sse(anthropic_stream({"output_tokens": 75}))
    assert from_stream == from_json
    assert buckets(from_stream) == {"input": 50, "cache_read": 4000, "cache_write_5m": 1000,
                                    "cache_write_1h": 2000, "output": 75, "reasoning": 0}


def test_null_fields_in_message_delta_do_not_erase_message_start_values():
    usage = usage_from_sse(anthropic_stream({"input_tokens": None, "cache_read_input_tokens": None,
                                             "output_tokens": 75}))
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens) == (50, 4000, 75)


# ------------------------------------------------------------ cache write TTLs


def test_5m_and_1h_cache_writes_are_priced_at_their_own_rates(prices):
    usage = usage_from_usage_object({"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 2000,
                                     "cache_creation": {"ephemeral_5m_input_tokens": 1000,
                                                        "ephemeral_1h_input_tokens": 1000}},
                                    model="example-sonnet")
    assert (usage.cache_write_5m_tokens, usage.cache_write_1h_tokens) == (1000, 1000)
    result = prices.price(usage)
    # 1000 * 3.75e-6 + 1000 * 6.00e-6; a single "cache write" rate would give 0.0075 or 0.012
    assert result.cost_usd == Decimal("0.00975")
    assert result.cost_by_bucket == {"input": 0, "cache_read": 0, "cache_write_5m": Decimal("0.00375"),
                                     "cache_write_1h": Decimal("0.006"), "output": 0}


def test_cache_write_without_ttl_split_counts_as_5m_and_is_flagged():
    usage = usage_from_usage_object({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 700})
    assert (usage.cache_write_5m_tokens, usage.cache_write_1h_tokens) == (700, 0)
    assert usage.flags == ["ttl_split_missing"]


def test_no_flag_when_there_is_nothing_to_split():
    usage = usage_from_usage_object({"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0})
    assert usage.flags == []


def test_ttl_split_that_does_not_add_up_is_flagged_and_the_remainder_counted_as_5m():
    usage = usage_from_usage_object({"input_tokens": 1, "output_tokens": 1, "cache_creation_input_tokens": 900,
                                     "cache_creation": {"ephemeral_1h_input_tokens": 600}})
    assert (usage.cache_write_5m_tokens, usage.cache_write_1h_tokens) == (300, 600)
    assert usage.flags == ["ttl_split_incomplete"]


# ----------------------------------------------------- OpenAI cached and reasoning


def test_openai_prompt_tokens_include_cached_tokens_counted_once():
    body = {"id": "c", "object": "chat.completion", "model": "example-openai-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1500, "completion_tokens": 180, "total_tokens": 1680,
                      "prompt_tokens_details": {"cached_tokens": 1280},
                      "completion_tokens_details": {"reasoning_tokens": 64}}}
    usage = usage_from_json(json.dumps(body))
    assert (usage.input_tokens, usage.cache_read_tokens) == (220, 1280)
    assert usage.input_tokens + usage.cache_read_tokens == 1500  # not 2780
    assert (usage.output_tokens, usage.reasoning_tokens) == (180, 64)
    assert usage.total_tokens == 1680


def test_openai_cached_above_prompt_is_not_turned_negative():
    usage = usage_from_usage_object({"prompt_tokens": 100, "completion_tokens": 1,
                                     "prompt_tokens_details": {"cached_tokens": 300}})
    assert (usage.input_tokens, usage.cache_read_tokens) == (100, 300)


def test_openai_responses_json_and_stream():
    response = {"id": "resp_1", "object": "response", "model": "example-openai-model", "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}],
                "usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 512},
                          "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 200},
                          "total_tokens": 1200}}
    from_json = usage_from_json(json.dumps(response))
    assert buckets(from_json) == {"input": 388, "cache_read": 512, "cache_write_5m": 0, "cache_write_1h": 0,
                                  "output": 300, "reasoning": 200}
    assert from_json.provider == "openai" and from_json.api == "responses"
    stream = sse(("response.created", {"type": "response.created",
                                       "response": {**response, "status": "in_progress", "usage": None}}),
                 ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "ok"}),
                 ("response.completed", {"type": "response.completed", "response": response}))
    assert usage_from_sse(stream) == from_json


def test_responses_stream_cut_before_completed_is_incomplete_and_estimated():
    stream = sse(("response.created", {"type": "response.created",
                                       "response": {"object": "response", "model": "m", "usage": None}}),
                 ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "y" * 21}))
    usage = usage_from_sse(stream)
    assert usage.complete is False
    assert usage.output_tokens == 6
    assert usage.flags == ["usage_missing", "output_estimated", "incomplete"]


# ------------------------------------------------------------ incomplete streams


def test_stream_cut_before_the_final_usage_is_incomplete_with_estimated_output():
    usage = usage_from_sse(anthropic_stream(final_usage=None, stop=False), transport_complete=False)
    assert usage.complete is False
    # input and cache are exact (message_start); output: 40 bytes of text / 4
    assert (usage.input_tokens, usage.cache_read_tokens, usage.cache_write_1h_tokens) == (50, 4000, 2000)
    assert usage.output_tokens == 10
    assert usage.flags == ["output_estimated", "incomplete"]


def test_bug15_stream_cut_inside_the_emoji_still_counts_received_text():
    chunks = network_chunks()
    usage = usage_from_sse(chunks[:3], transport_complete=False)
    assert (usage.input_tokens, usage.cache_read_tokens) == (321, 1024)
    assert usage.complete is False and "output_estimated" in usage.flags


def test_disconnect_after_final_usage_keeps_exact_numbers_but_is_incomplete():
    usage = usage_from_sse(anthropic_stream({"output_tokens": 75}, stop=False), transport_complete=False)
    assert usage.output_tokens == 75
    assert usage.flags == ["incomplete"]


def test_first_of_two_deltas_is_not_final_so_a_cut_there_estimates():
    whole = (BUG12 / "stream_c_two_deltas.sse").read_bytes()
    cut = whole.index(b"event: content_block_start", whole.index(b"message_delta"))
    usage = usage_from_sse(whole[:cut], transport_complete=False)
    assert usage.output_tokens == 120  # reported so far, above the 3-token estimate of "Searching..."
    assert usage.flags == ["output_estimated", "incomplete"]


def test_whole_stream_not_delivered_to_the_client_is_incomplete():
    usage = usage_from_sse((BUG12 / "stream_a_output_only_delta.sse").read_bytes(), transport_complete=False)
    assert usage.output_tokens == 15
    assert usage.complete is False and usage.flags == ["incomplete"]


def test_cut_json_body_is_estimated_from_its_bytes():
    body = json.dumps({"type": "message", "model": "m", "content": [{"type": "text", "text": "z" * 100}],
                       "usage": {"input_tokens": 5, "output_tokens": 25}}).encode()
    usage = usage_from_json(body[:80], api="messages")
    assert usage.provider == "anthropic"
    assert usage.output_tokens == 20 and usage.estimate_basis_bytes == 80
    assert usage.flags == ["usage_missing", "output_estimated", "incomplete"]


def test_json_body_without_usage_is_flagged_usage_missing():
    usage = usage_from_json(json.dumps({"object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "12345678"}}]}))
    assert usage.output_tokens == 2
    assert usage.complete is True
    assert usage.flags == ["usage_missing", "output_estimated"]


def test_odd_values_do_not_crash():
    usage = usage_from_usage_object({"input_tokens": "12", "output_tokens": -3, "cache_read_input_tokens": True,
                                     "cache_creation": "nope"})
    assert buckets(usage) == {"input": 0, "cache_read": 0, "cache_write_5m": 0, "cache_write_1h": 0,
                              "output": 0, "reasoning": 0}
    assert detect_api([1, 2]) is None
    assert usage_from_sse(b"data: {not json\n\ndata: [1]\n\n").flags == ["usage_missing", "output_estimated",
                                                                           "incomplete"]


def test_estimate_request_input_tokens_reads_text_only():
    request = {"system": "s" * 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "t" * 8},
        {"type": "image", "source": {"type": "base64", "data": "Q" * 4000}}]}]}
    assert estimate_request_input_tokens(request) == 4  # 16 bytes of text; labels and base64 are skipped
    assert estimate_request_input_tokens(None) == 0


# ------------------------------------------------- flexible accounting usage file


TOTALS = {"requests": 3, "refused": 1, "rate_limited": 0, "input_tokens": 220, "cache_read_tokens": 1280,
          "cache_write_5m_tokens": 0, "cache_write_1h_tokens": 0, "output_tokens": 180, "reasoning_tokens": 64,
          "total_tokens": 1680, "unpriced_tokens": 0, "cost_usd": "0.00252", "unpriced_models": ["x"]}


def test_usage_file_lines_are_numeric_key_values():
    lines = usage_file_lines(TOTALS)
    assert lines[:4] == ["tco_requests=3", "tco_refused=1", "tco_rate_limited=0", "tco_input_tokens=220"]
    assert "tco_cost_usd=0.00252" in lines
    for line in lines:
        key, value = line.split("=")
        assert key.startswith("tco_")
        float(value)  # qacct <= 9.1 reads these values as doubles
    assert not any("unpriced_models" in line for line in lines)


def test_usage_file_omits_cost_when_nothing_was_priced_and_refuses_non_numbers():
    assert not any(line.startswith("tco_cost_usd") for line in usage_file_lines({**TOTALS, "cost_usd": None}))
    with pytest.raises(ValueError):
        usage_file_lines({"input_tokens": "220"})
    with pytest.raises(ValueError):
        usage_file_lines({"requests": True})


def test_append_usage_file_keeps_the_shepherd_lines(tmp_path):
    usage_file = tmp_path / "usage"
    usage_file.write_bytes(b"wallclock=12.5\nru_utime=0.25\nexit_status=0")  # no final newline
    append_usage_file(usage_file, TOTALS)
    lines = usage_file.read_text().splitlines()
    assert lines[:3] == ["wallclock=12.5", "ru_utime=0.25", "exit_status=0"]
    values = dict(line.split("=", 1) for line in lines)
    assert values["tco_input_tokens"] == "220" and values["tco_output_tokens"] == "180"
    assert values["tco_cache_read_tokens"] == "1280" and values["tco_cost_usd"] == "0.00252"
    assert all(float(v) >= 0 for v in values.values())
