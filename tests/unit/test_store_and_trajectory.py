"""Durable capture and the segment export rebuilt from records alone."""

from datetime import UTC, datetime

import pytest

from gateway.store import CallRecord, PromptRef, SegmentOpened, SessionMeta, SessionStore
from gateway.trajectory import TrajectoryCorruptError, build_segments
from schemas.sampling import SamplingParams
from schemas.scenes import Scene
from schemas.session import SessionConfig
from schemas.trajectory import CallStatus, MatchKind, RecordedCall


def call(call_id: str, segment: str, prompt: list[int], out: list[int], **kw: object) -> CallRecord:
    data: dict[str, object] = {
        "call_id": call_id,
        "segment_id": segment,
        "scene": Scene.main,
        "protocol": "openai_chat",
        "path": "/v1/chat/completions",
        "status": CallStatus.ok,
        "match": MatchKind.clean,
        "prompt_ids": prompt,
        "output_ids": out,
        "output_logprobs": [-0.1 * (i + 1) for i in range(len(out))],
        "new_prompt_tokens": len(prompt),
        "sampling": SamplingParams(temperature=1.0),
        "policy_version": "p",
        "started_at": datetime.now(UTC),
        "duration_s": 0.01,
    }
    data.update(kw)
    return CallRecord(call=RecordedCall.model_validate(data))


def test_segment_is_prompt_then_new_parts_and_sampled_tokens() -> None:
    records = [
        SegmentOpened(segment_id="a", scene="main"),
        call("c1", "a", [1, 2, 3], [10, 11]),
        call("c2", "a", [1, 2, 3, 10, 11, 4, 5], [12]),
        call("c3", "a", [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14]),
    ]
    (seg,) = build_segments(records, {Scene.main})
    assert seg.prompt_ids == [1, 2, 3]
    assert seg.response_ids == [10, 11, 4, 5, 12, 6, 13, 14]
    assert seg.loss_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert seg.logprobs[:2] == [-0.1, -0.2]
    assert seg.logprobs[2:4] == [0.0, 0.0]
    assert seg.call_ids == ["c1", "c2", "c3"]
    assert seg.trainable


def test_failed_calls_are_skipped_and_forks_keep_their_parent() -> None:
    records = [
        SegmentOpened(segment_id="a", scene="main"),
        call("c1", "a", [1, 2], [9]),
        call("c2", "a", [1, 2, 9, 3], [], status=CallStatus.engine_error, output_logprobs=[]),
        SegmentOpened(segment_id="b", parent_id="a", scene="title"),
        call("c3", "b", [7, 7], [8]),
    ]
    a, b = build_segments(records, {Scene.main})
    assert a.call_ids == ["c1"] and a.response_ids == [9]
    assert b.parent_id == "a" and not b.trainable


def test_a_call_that_does_not_extend_its_segment_is_refused() -> None:
    records = [
        SegmentOpened(segment_id="a", scene="main"),
        call("c1", "a", [1, 2], [9]),
        call("c2", "a", [1, 3, 9, 4], [5]),
    ]
    with pytest.raises(TrajectoryCorruptError, match="c2"):
        build_segments(records, {Scene.main})


def test_store_round_trip_survives_a_torn_last_line(tmp_path) -> None:
    store = SessionStore(tmp_path)
    meta = SessionMeta(
        session_id="s1",
        config=SessionConfig(rollout_id="r"),
        token_sha256="0" * 64,
        engine_url="http://127.0.0.1:1",
        prompt_template_version="t",
        created_at=datetime.now(UTC),
    )
    store.create(meta)
    store.append("s1", SegmentOpened(segment_id="a", scene="main"))
    store.append("s1", call("c1", "a", [1], [2]))
    with open(tmp_path / "sessions" / "s1" / "records.jsonl", "a") as fh:
        fh.write('{"kind": "call", "call": {"call_id": "torn')
    reopened = SessionStore(tmp_path)
    assert reopened.load_meta("s1") == meta
    records = reopened.load_records("s1")
    assert [type(r).__name__ for r in records] == ["SegmentOpened", "CallRecord"]
    assert not reopened.is_closed("s1")
    reopened.mark_closed("s1")
    assert reopened.is_closed("s1")
    with pytest.raises(ValueError):
        reopened.load_meta("../etc")


def test_prompt_references_expand_on_load_and_unknown_ones_are_refused(tmp_path) -> None:
    store = SessionStore(tmp_path)
    meta = SessionMeta(
        session_id="s2",
        config=SessionConfig(rollout_id="r"),
        token_sha256="0" * 64,
        engine_url="http://127.0.0.1:1",
        prompt_template_version="t",
        created_at=datetime.now(UTC),
    )
    store.create(meta)
    store.append("s2", SegmentOpened(segment_id="a", scene="main"))
    store.append("s2", call("c1", "a", [1, 2, 3], [4, 5]))
    tail = call("c2", "a", [6, 7], [8])
    store.append("s2", tail.model_copy(update={"prompt_ref": PromptRef(call_id="c1", length=5)}))
    records = store.load_records("s2")
    assert records[2].call.prompt_ids == [1, 2, 3, 4, 5, 6, 7]
    assert records[2].prompt_ref is None
    store.append("s2", tail.model_copy(update={"prompt_ref": PromptRef(call_id="zz", length=1)}))
    with pytest.raises(ValueError, match="unknown prompt"):
        store.load_records("s2")
