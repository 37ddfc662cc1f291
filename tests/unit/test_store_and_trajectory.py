"""Durable capture and the segment export rebuilt from records alone."""

import errno
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import gateway.capture.store
from gateway.capture.store import CallEntry, PromptRef, SegmentOpened, SessionMeta, SessionStore
from gateway.capture.trajectory import TrajectoryCorruptError, build_segments
from schemas.sampling import SamplingParams
from schemas.scenes import Scene
from schemas.session import SessionConfig
from schemas.trajectory import CallStatus, MatchKind, RecordedCall


def call(call_id: str, segment: str, prompt: list[int], out: list[int], **kw: object) -> CallEntry:
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
    return CallEntry(call=RecordedCall.model_validate(data))


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
    assert [type(r).__name__ for r in records] == ["SegmentOpened", "CallEntry"]
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


def new_store(tmp_path: Path, session_id: str = "s1", **kw: Any) -> SessionStore:
    store = SessionStore(tmp_path, **kw)
    store.create(
        SessionMeta(
            session_id=session_id,
            config=SessionConfig(rollout_id="r"),
            token_sha256="0" * 64,
            engine_url="http://127.0.0.1:1",
            prompt_template_version="t",
            created_at=datetime.now(UTC),
        )
    )
    return store


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    store.append("s1", SegmentOpened(segment_id="a", scene="main"))
    store.append("s1", call("c1", "a", [1], [2]))
    records_file = tmp_path / "sessions" / "s1" / "records.jsonl"
    intact = records_file.read_bytes()
    with open(records_file, "ab") as fh:  # a crash in the middle of writing c2
        fh.write(b'{"kind":"call","call":{"call_id":"c2","segm')
    restarted = SessionStore(tmp_path)
    restarted.append("s1", SegmentOpened(segment_id="b", scene="main"))
    restarted.append("s1", call("c3", "b", [5], [6]))
    records = restarted.load_records("s1")
    assert [getattr(r, "segment_id", None) or r.call.call_id for r in records] == [
        "a",
        "c1",
        "b",
        "c3",
    ]
    assert records_file.read_bytes().startswith(intact + b'{"kind":"segment"')


def test_a_corrupt_record_in_the_middle_is_reported_with_file_and_line(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    store.append("s1", SegmentOpened(segment_id="a", scene="main"))
    records_file = tmp_path / "sessions" / "s1" / "records.jsonl"
    with open(records_file, "ab") as fh:
        fh.write(b'{"kind":"call","call":{"call_id":"glued"{"kind":"call"}\n')
    store.append("s1", call("c1", "a", [1], [2]))
    with pytest.raises(gateway.capture.store.CorruptRecordError) as caught:
        store.load_records("s1")
    assert str(caught.value).startswith(f"{records_file} line 2: corrupt record")
    # A complete line that parses but is not a record is corruption too.
    records_file.write_bytes(records_file.read_bytes().replace(b'"kind":"segment"', b'"kind":1'))
    with pytest.raises(gateway.capture.store.CorruptRecordError, match=r"records\.jsonl line 1: "):
        store.load_records("s1")


def enospc_after(limit: int, real_write: Callable[[int, Any], int]) -> Callable[[int, Any], int]:
    """os.write that fills the disk after `limit` more bytes to a records file."""
    budget = [limit]

    def write(fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith("records.jsonl"):
            return real_write(fd, data)
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = real_write(fd, bytes(data[: budget[0]]))
        budget[0] -= written
        return written

    return write


def test_a_failed_append_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = new_store(tmp_path)
    store.append("s1", SegmentOpened(segment_id="a", scene="main"))
    records_file = tmp_path / "sessions" / "s1" / "records.jsonl"
    before = records_file.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", enospc_after(20, os.write))
        with pytest.raises(OSError) as caught:
            store.append("s1", call("c1", "a", [1], [2]), call("c2", "a", [1, 2, 3], [4]))
    assert caught.value.errno == errno.ENOSPC
    assert records_file.read_bytes() == before, "the half-written record is cut back off"
    with pytest.raises(ValueError, match="surrogates not allowed"):
        store.append("s1", call("c1", "a", [1], [2], error="\ud800"))
    assert records_file.read_bytes() == before
    store.append("s1", call("c1", "a", [1], [2])).result(timeout=5)
    assert [type(r).__name__ for r in store.load_records("s1")] == ["SegmentOpened", "CallEntry"]


def test_records_size_is_the_files_through_appends_a_failed_one_and_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store keeps the size of the files it appends to (no stat per call): it must
    stay the file's size."""
    store = new_store(tmp_path)
    records_file = tmp_path / "sessions" / "s1" / "records.jsonl"
    assert store.records_size("s1") == 0
    store.append("s1", SegmentOpened(segment_id="a", scene="main")).result(timeout=5)
    assert store.records_size("s1") == records_file.stat().st_size > 0
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", enospc_after(20, os.write))
        with pytest.raises(OSError):
            store.append("s1", call("c1", "a", [1], [2]))
    assert store.records_size("s1") == records_file.stat().st_size
    store.append("s1", call("c1", "a", [1], [2])).result(timeout=5)
    assert store.records_size("s1") == records_file.stat().st_size
    with open(records_file, "ab") as fh:
        fh.write(b'{"kind":"ca')  # torn by a crash
    restarted = SessionStore(tmp_path)
    assert restarted.records_size("s1") == records_file.stat().st_size
    restarted.append("s1", call("c2", "a", [1], [2])).result(timeout=5)
    assert restarted.records_size("s1") == records_file.stat().st_size
    assert records_file.read_bytes().count(b"\n") == 3


def test_group_commit_syncs_before_acknowledging_and_off_never_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[bytes] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(str(tmp_path)):  # not a sync another test's store left pending
            synced.append(Path(path).read_bytes() if os.path.isfile(path) else b"<dir>")

    monkeypatch.setattr(os, "fsync", fsync)
    off = new_store(tmp_path / "off", durability="off")
    assert off.append("s1", SegmentOpened(segment_id="a", scene="main")).done()
    off.mark_closed("s1")
    assert synced == []

    # The five appends below must come within one interval of the first batch: half a
    # second is far more than a busy machine needs for them.
    store = new_store(tmp_path / "group", sync_interval_s=0.5)
    synced.clear()
    started = time.monotonic()  # before the first batch, so the next starts >= 0.5 s later
    first = store.append("s1", SegmentOpened(segment_id="a", scene="main"))
    first.result(timeout=5)
    assert len(synced) == 1 and b'"segment_id":"a"' in synced[0]
    futures = [store.append("s1", call(f"c{i}", "a", [1], [2])) for i in range(5)]
    for future in futures:
        future.result(timeout=5)
    assert time.monotonic() - started >= 0.4, "a batch starts at most every interval"
    assert len(synced) == 2, "the five appends to one file share one fsync"
    assert all(f'"call_id":"c{i}"'.encode() in synced[1] for i in range(5))


class CountingReads:
    """Wraps the store module's `open`: the bytes every file it opens hands back."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fh = open(*args, **kwargs)  # noqa: SIM115 - handed back to the caller to close
        counter = self

        class Counted:
            def __enter__(self) -> "Counted":
                return self

            def __exit__(self, *exc: object) -> None:
                fh.close()

            def __iter__(self) -> Any:
                for line in fh:
                    counter.bytes += len(line)
                    yield line

            def readline(self) -> bytes:
                line = fh.readline()
                counter.bytes += len(line)
                return line

            def __getattr__(self, name: str) -> Any:
                return getattr(fh, name)

        return Counted()


def chained_store(
    tmp_path: Path, calls: int, pad: int, step: int = 2
) -> tuple[SessionStore, list[CallEntry]]:
    """`calls` calls, each continuing the previous one's prompt+output with `step` new
    prompt ids (written as prompt references, as the pipeline writes them), each with `pad`
    characters of request."""
    store = new_store(tmp_path)
    store.append("s1", SegmentOpened(segment_id="a", scene="main"))
    full: list[int] = []
    written: list[CallEntry] = []
    for n in range(calls):
        prompt = [*full, *range(1000 * (n + 1), 1000 * (n + 1) + step)]
        entry = call(f"c{n}", "a", prompt, [2000 + n])
        if n:
            entry.call.prompt_ids = prompt[len(full) :]
            entry.prompt_ref = PromptRef(call_id=f"c{n - 1}", length=len(full))
        entry.request = {"pad": "x" * pad}
        store.append("s1", entry)
        written.append(entry)
        full = [*prompt, 2000 + n]
    return store, written


def test_a_call_is_read_back_alone_with_its_prompt_length_and_tail(tmp_path: Path) -> None:
    store, written = chained_store(tmp_path, calls=12, pad=10)
    loaded = {r.call.call_id: r for r in store.load_records("s1") if isinstance(r, CallEntry)}
    offsets = {cid: r.offset for cid, r in loaded.items()}
    assert offsets == {w.call.call_id: w.offset for w in written}, "append and load agree"
    for cid, whole in loaded.items():
        assert whole.offset is not None
        entry = store.read_entry("s1", whole.offset)
        assert entry.call.call_id == cid
        for count in (1, 2, 3, 7, 100):
            length, tail = store.prompt_tail("s1", entry, offsets.get, count)
            assert length == len(whole.call.prompt_ids)
            assert tail == whole.call.prompt_ids[-count:], (cid, count)


def test_a_retry_reads_its_record_not_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, written = chained_store(tmp_path, calls=40, pad=20_000, step=80)
    size = (tmp_path / "sessions" / "s1" / "records.jsonl").stat().st_size
    reads = CountingReads()
    monkeypatch.setattr(gateway.capture.store, "open", reads, raising=False)
    store.load_records("s1")
    assert reads.bytes == size, "control: the wrapper sees a whole-file read"
    reads.bytes = 0
    offsets = {w.call.call_id: w.offset for w in written}
    target = written[20]
    assert target.offset is not None
    entry = store.read_entry("s1", target.offset)
    length, tail = store.prompt_tail("s1", entry, offsets.get, 64)
    assert (length, tail[-1]) == (81 * 20 + 80, 21079)
    line = len(target.model_dump_json()) + 1
    assert reads.bytes == line, "the record alone: its 80 new prompt ids hold the tail"
    assert reads.bytes < size / 20
