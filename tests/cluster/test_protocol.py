"""Every protocol message round-trips through msgpack; malformed frames are ProtocolErrors."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest

from radixcluster import protocol as p


def sampling_batch() -> p.SamplingBatch:
    return p.SamplingBatch(
        temperature=np.array([0.0, 0.7], np.float32),
        top_p=np.array([1.0, 0.9], np.float32),
        top_k=np.array([-1, 40], np.int32),
        min_p=np.array([0.0, 0.05], np.float32),
        frequency_penalty=np.zeros(2, np.float32),
        presence_penalty=np.array([0.0, 0.5], np.float32),
        repetition_penalty=np.ones(2, np.float32),
        seed=np.array([-1, 2**40], np.int64),
        penalty_ids=np.array([3, 4, 5], np.int32),
        penalty_lens=np.array([0, 3], np.int32),
        prompt_penalty_ids=np.array([1, 9], np.int32),
        prompt_penalty_lens=np.array([2, 0], np.int32),
        top_logprobs_num=np.array([0, 5], np.int32),
        bias_ids=np.array([7], np.int32),
        bias_values=np.array([-2.5], np.float32),
        bias_lens=np.array([1, 0], np.int32),
        return_logprob=True,
    )


SAMPLES = [
    p.SamplingParams(max_new_tokens=3, temperature=0.2, stop=["\n"], stop_token_ids=[2], seed=7, json_schema="{}"),
    p.SamplingParams(logit_bias={28: 5.0, 100: -100.0}),
    p.GenerateRequest(
        rid="a",
        sampling=p.SamplingParams(top_k=5),
        input_ids=[1, 2, 3],
        return_logprob=True,
        logprob_start_len=0,
        cache_salt="tenant",
    ),
    p.GenerateRequest(rid="b", sampling=p.SamplingParams(), messages=[{"role": "user", "content": "hi"}], stream=True),
    p.GenerateRequest(rid="c", sampling=p.SamplingParams(), text="hi", pins=[p.PromptPin(60.0), p.PromptPin(5.0, 1)]),
    p.PromptPin(300.0, 2),
    p.GenerateRequest(
        rid="d", sampling=p.SamplingParams(), text="hi", tokens=p.PromptTokens("f0", np.array([7, 8], np.int32))
    ),
    p.PromptTokens("f1", np.array([1, 2, 3], np.int32)),
    p.AbortRequest(rid="a"),
    p.RequestOutput(
        rid="a",
        text="x",
        output_ids=[5],
        finished=True,
        finish_reason={"type": "length", "length": 1},
        output_logprobs=[[-0.1, 5, [[-0.1, 5]]]],
        input_logprobs=[[None, 1], [-2.5, 2]],
        error=None,
    ),
    p.ControlRequest(cid="c", kind="flush_cache", args={"x": 1}),
    p.ControlResponse(cid="c", payload={"success": True, "nested": {"a": [1, 2.5]}}),
    sampling_batch(),
    p.ForwardBatch(
        step_id=3,
        input_ids=np.arange(5, dtype=np.int32),
        positions=np.array([0, 1, 2, 7, 9], np.int32),
        slots=np.array([0, 1], np.int32),
        prefix_lens=np.array([0, 9], np.int32),
        extend_lens=np.array([3, 2], np.int32),
        table_slots=np.array([0], np.int32),
        table_starts=np.array([0], np.int32),
        table_counts=np.array([2], np.int32),
        table_pages=np.array([10, 11], np.int32),
        sampling=sampling_batch(),
        vocab_mask=np.full((2, 3), 0xFFFFFFFF, dtype=np.uint32).view(np.int32),
        logprob_starts=np.array([-1, 0], np.int32),
        logprob_next_ids=np.array([-1, 7], np.int32),
    ),
    p.StepResult(
        step_id=3,
        next_token_ids=np.array([4, 2], np.int32),
        logprobs=np.array([-0.5, -1.0], np.float32),
        top_logprob_ids=np.array([[4, 1], [2, 3]], np.int32),
        top_logprob_values=np.array([[-0.5, -2.0], [-1.0, -3.0]], np.float32),
    ),
    p.RankFailed(rank=2, step_id=4, error="RuntimeError: worker died"),
    p.Profile(start=True, output_dir="/traces", profile_id="1.5", prefix="p-", activities=["CPU"], with_stack=True),
    p.Profile(start=False),
    p.Shutdown(),
    p.RouterReady(),
    p.GroupDown(generation=1, reason="rank 2 died"),
    p.RestartGroup(generation=1, reason="rank 2 died"),
    p.GroupUp(generation=2),
    p.TreeEvent(instance="9f2c", seq=7, kind="evict", blocks=np.array([2**64 - 1, 0, 12345], np.uint64)),
]


def assert_same(a: object, b: object) -> None:
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


def test_every_message_type_is_covered() -> None:
    assert {type(m).__name__ for m in SAMPLES} == set(p._REGISTRY)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    assert_same(msg, p.decode(p.encode(msg)))


def test_integers_past_64_bits_in_free_form_json_come_back_whole() -> None:
    # a tool call's arguments, as a client sent them
    call = {"function": {"name": "f", "arguments": {"order_id": 98765432109876543210, "neg": -(2**70)}}}
    msg = p.GenerateRequest(
        rid="a", sampling=p.SamplingParams(), messages=[{"role": "assistant", "tool_calls": [call]}]
    )
    assert p.decode(p.encode(msg)).messages[0]["tool_calls"] == [call]


def test_big_endian_arrays_come_back_native() -> None:
    arr = np.arange(4, dtype=">i4")
    back = p.decode(p.encode(p.StepResult(step_id=1, next_token_ids=arr))).next_token_ids
    assert back.tolist() == [0, 1, 2, 3] and back.dtype == np.dtype("<i4")


def frame(version: object, name: object, fields: object) -> bytes:
    return msgpack.packb([version, name, fields], use_bin_type=True)


def test_unknown_version_is_a_protocol_error() -> None:
    with pytest.raises(p.ProtocolError, match="version"):
        p.decode(frame(p.PROTOCOL_VERSION + 1, "AbortRequest", {"rid": "a"}))


def test_unknown_type_is_a_protocol_error() -> None:
    with pytest.raises(p.ProtocolError, match="unknown message type 'Nope'"):
        p.decode(frame(p.PROTOCOL_VERSION, "Nope", {}))


def test_unknown_field_is_a_protocol_error() -> None:
    with pytest.raises(p.ProtocolError, match="bad fields for AbortRequest"):
        p.decode(frame(p.PROTOCOL_VERSION, "AbortRequest", {"rid": "a", "extra": 1}))


def test_garbage_and_non_messages_are_protocol_errors() -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(b"\xc1\x00")
    with pytest.raises(p.ProtocolError, match="frame"):
        p.decode(msgpack.packb([1, 2]))
    with pytest.raises(p.ProtocolError, match="not a protocol message"):
        p.encode({"rid": "a"})
