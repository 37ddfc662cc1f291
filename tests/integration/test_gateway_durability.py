"""Capture that survives faults: a call whose record cannot be written leaves no trace (not
on disk, not in memory), a line torn by a crash is cut off, corruption is reported, and
with group commit a call is answered only once its record is on disk. Real Gateway over
HTTP in front of the scripted engine; faults are injected at the system calls."""

import contextlib
import errno
import json
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from gateway.capture.store import CallEntry

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"


@pytest.fixture
def scripted(tiny_model_dir: Path) -> Iterator[BackgroundServer]:
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(rules=[ScriptRule(reply="<think>\nok\n</think>\n\nHello there.", repeat=True)]),
        model=MODEL,
    )
    with BackgroundServer(engine.app()) as server:
        yield server


class Agent:
    """One conversation over raw HTTP (bodies may hold lone surrogates, as JSON escapes)."""

    def __init__(self, url: str, token: str, protocol: str = "openai") -> None:
        self.url, self.token, self.protocol = url, token, protocol
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]

    def send(self, **extra: Any) -> httpx.Response:
        body = {"model": MODEL, "messages": self.messages, **extra}
        if self.protocol == "openai":
            path, headers = "/v1/chat/completions", {"Authorization": f"Bearer {self.token}"}
        else:
            path, headers = "/v1/messages", {"x-api-key": self.token}
            body.setdefault("max_tokens", 64)
        headers["content-type"] = "application/json"
        return httpx.post(self.url + path, content=json.dumps(body), headers=headers, timeout=30)

    def turn(self, **extra: Any) -> httpx.Response:
        """Send; on success keep the reply and add the next user message."""
        reply = self.send(**extra)
        if reply.status_code == 200:
            data = reply.json()
            if self.protocol == "openai":
                said: Any = data["choices"][0]["message"]["content"]
            else:
                said = data["content"]  # thinking and text blocks, echoed as Claude Code does
            self.messages += [
                {"role": "assistant", "content": said},
                {"role": "user", "content": f"more {len(self.messages)}"},
            ]
        return reply


def error_of(reply: httpx.Response, protocol: str) -> dict[str, Any]:
    """The error object of a reply in the protocol's own shape."""
    body = reply.json()
    if protocol == "anthropic":
        assert body["type"] == "error"
        return body["error"]
    return body["error"]


def held_tokens(gw: Any, session_id: str) -> list[list[int]]:
    """What the live session holds in memory, one token list per held segment."""
    return [list(seg.ids) for seg in gw.gateway.sessions[session_id].held]


def assert_memory_and_disk_agree(gw: Any, session_id: str, trajectory: dict[str, Any]) -> None:
    on_disk = [s["prompt_ids"] + s["response_ids"] for s in trajectory["segments"]]
    assert held_tokens(gw, session_id) == on_disk


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_unencodable_text_in_an_ignored_field_is_a_400_and_loses_nothing(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any, protocol: str
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    agent = Agent(gw.url, session["token"], protocol)
    assert agent.turn().status_code == 200
    assert agent.turn().status_code == 200
    before = gw.trajectory(session["session_id"])

    field = "user" if protocol == "openai" else "metadata"
    value = "x\ud800y" if protocol == "openai" else {"user_id": "\ud800"}
    reply = agent.send(**{field: value})
    assert reply.status_code == 400, reply.text
    error = error_of(reply, protocol)
    expected_type = "invalid_request_error"
    assert error["type"] == expected_type and field in error["message"]
    assert gw.trajectory(session["session_id"]) == before, "nothing was recorded"

    assert agent.turn().status_code == 200, "the session goes on"
    after = gw.trajectory(session["session_id"])
    assert after["calls"][:2] == before["calls"] and len(after["calls"]) == 3
    assert len(after["segments"]) == 1 and after["segments"][0]["call_ids"] == [
        c["call_id"] for c in after["calls"]
    ]
    assert_memory_and_disk_agree(gw, session["session_id"], after)


def enospc_mid_record(real_write: Callable[[int, Any], int]) -> Callable[[int, Any], int]:
    """`os.write` on a records file: the first writes half the bytes, the next finds the
    disk full (what a record larger than the space left sees)."""
    state = {"half_written": False}

    def write(fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith("records.jsonl"):
            return real_write(fd, data)
        if state["half_written"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        state["half_written"] = True
        return real_write(fd, bytes(data[: len(data) // 2]))

    return write


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """A real kernel write failure, no patching: writes past `limit` bytes fail with EFBIG
    (after a short write up to the limit) while the limit is set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def emfile_on_open(real_open: Callable[..., int]) -> Callable[..., int]:
    """`os.open` that is out of file descriptors for records files."""

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("records.jsonl"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, *args, **kwargs)

    return open_


@pytest.mark.parametrize(
    ("protocol", "fault", "failing_turn"),
    [("openai", "enospc", 0), ("openai", "efbig", 2), ("anthropic", "emfile", 1)],
)
def test_a_failed_write_is_a_503_and_the_session_goes_on(
    scripted: BackgroundServer,
    tiny_model_dir: Path,
    gateway_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
    protocol: str,
    fault: str,
    failing_turn: int,
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    sid = session["session_id"]
    records_file = gw.gateway.store.root / sid / "records.jsonl"
    agent = Agent(gw.url, session["token"], protocol)
    for _ in range(failing_turn):
        assert agent.turn().status_code == 200
    on_disk = records_file.read_bytes()

    with monkeypatch.context() as patch:
        if fault == "enospc":
            patch.setattr(os, "write", enospc_mid_record(os.write))
        elif fault == "emfile":
            patch.setattr(os, "open", emfile_on_open(os.open))
        with file_size_limit(len(on_disk) + 64) if fault == "efbig" else contextlib.nullcontext():
            reply = agent.turn()
    assert reply.status_code == 503, reply.text
    error = error_of(reply, protocol)
    assert error["type"] == ("api_error" if protocol == "anthropic" else "server_error")
    assert "could not record this call" in error["message"]
    assert reply.headers["retry-after"] == "1"
    assert records_file.read_bytes() == on_disk, "no half record is left behind"

    for _ in range(2):  # the agent retries, then goes on
        assert agent.turn().status_code == 200
    trajectory = gw.trajectory(sid)
    assert len(trajectory["calls"]) == failing_turn + 2
    # The retry extends the segment as if the failed call never happened (the OpenAI agent
    # here echoes replies without their reasoning: a forgiven drift, `realign`).
    extends = "clean" if protocol == "anthropic" else "realign"
    assert [(c["status"], c["match"]) for c in trajectory["calls"]] == [("ok", "fork")] + [
        ("ok", extends)
    ] * (failing_turn + 1)
    assert len(trajectory["segments"]) == 1
    assert_memory_and_disk_agree(gw, sid, trajectory)
    summary = httpx.get(f"{gw.control_url}/sessions/{sid}", headers=gw.admin_headers).json()
    assert (summary["calls"], summary["failed_calls"], summary["segments"]) == (
        failing_turn + 2,
        0,
        1,
    )

    gw.server.stop()
    restarted = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, data_dir=gw.gateway.options.data_dir
    )
    assert restarted.trajectory(sid) == trajectory


def test_a_torn_last_line_is_cut_when_a_revived_session_appends(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, MODEL)
    body = {"rollout_id": "r-torn", "idempotency_key": "r-torn/attempt-1"}
    session = httpx.post(f"{gw.control_url}/sessions", json=body, headers=gw.admin_headers).json()
    sid = session["session_id"]
    agent = Agent(gw.url, session["token"])
    for _ in range(2):
        assert agent.turn().status_code == 200
    gw.server.stop()
    records_file = gw.gateway.store.root / sid / "records.jsonl"
    with open(records_file, "ab") as fh:  # the process died in the middle of a write
        fh.write(b'{"kind":"call","call":{"call_id":"c0ffee","segment_id":"seg_')

    restarted = gateway_factory(
        scripted.url, tiny_model_dir, MODEL, data_dir=gw.gateway.options.data_dir,
        public_url=gw.url,
    )  # fmt: skip
    revived = httpx.post(
        f"{restarted.control_url}/sessions", json=body, headers=restarted.admin_headers
    )
    assert revived.status_code == 200
    agent.url = restarted.url
    assert agent.turn().status_code == 200, "the revived session goes on on its segment"
    trajectory = restarted.trajectory(sid)
    assert len(trajectory["calls"]) == 3 and len(trajectory["segments"]) == 1
    assert b"c0ffee" not in records_file.read_bytes()


def test_a_corrupt_record_is_reported_not_skipped(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    sid = session["session_id"]
    agent = Agent(gw.url, session["token"])
    for _ in range(3):
        assert agent.turn().status_code == 200
    records_file = gw.gateway.store.root / sid / "records.jsonl"
    lines = records_file.read_bytes().split(b"\n")
    lines[2] = lines[2][:40]  # a record in the middle loses its end
    records_file.write_bytes(b"\n".join(lines))
    reply = httpx.get(f"{gw.control_url}/sessions/{sid}/trajectory", headers=gw.admin_headers)
    assert reply.status_code == 500
    error = reply.json()["error"]
    assert error["code"] == "corrupt_record"
    assert error["message"].startswith(f"session {sid}: {records_file} line 3: corrupt record")


class FsyncLog:
    """`os.fsync` that records what each synced file held, optionally held at a gate."""

    def __init__(self) -> None:
        self.synced: list[bytes] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        self.entered.set()
        self.gate.wait(timeout=30)
        self._real(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        self.synced.append(Path(path).read_bytes() if os.path.isfile(path) else b"")


def test_group_commit_answers_a_call_only_after_its_record_is_synced(
    scripted: BackgroundServer,
    tiny_model_dir: Path,
    gateway_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fsync = FsyncLog()
    monkeypatch.setattr(os, "fsync", fsync)
    gw = gateway_factory(scripted.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    agent = Agent(gw.url, session["token"])
    for _ in range(3):
        reply = agent.turn()
        call_id = reply.json()["id"].removeprefix("chatcmpl-")
        assert any(call_id.encode() in content for content in fsync.synced)

    fsync.entered.clear()
    fsync.gate.clear()  # the disk is slow: the next sync does not finish yet
    replies: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: replies.append(agent.turn()))
    sender.start()
    assert fsync.entered.wait(timeout=30)
    time.sleep(0.5)
    assert replies == [], "no answer before the call's record is on disk"
    fsync.gate.set()
    sender.join(timeout=30)
    (reply,) = replies
    call_id = reply.json()["id"].removeprefix("chatcmpl-")
    assert call_id.encode() in fsync.synced[-1]


def test_fsync_off_never_syncs(
    scripted: BackgroundServer,
    tiny_model_dir: Path,
    gateway_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fsync = FsyncLog()
    monkeypatch.setattr(os, "fsync", fsync)
    gw = gateway_factory(scripted.url, tiny_model_dir, MODEL, fsync="off")
    session = gw.create_session()
    agent = Agent(gw.url, session["token"])
    for _ in range(3):
        assert agent.turn().status_code == 200
    httpx.delete(f"{gw.control_url}/sessions/{session['session_id']}", headers=gw.admin_headers)
    assert len(gw.trajectory(session["session_id"])["calls"]) == 3
    assert fsync.synced == []


def test_every_record_is_written_as_its_validated_model_writes_it(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """Records are built from already-typed parts without validating them again: each line
    must read back through the validated model (as every reader reads it) and write out
    byte for byte the same (a part of a type the model does not hold, say a number as
    text, would fail or change the bytes)."""
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(
            default_reply='<think>\nok\n</think>\n\n<tool_call>\n{"name": "run", '
            '"arguments": {"cmd": "ls"}}\n</tool_call>'
        ),
        model=MODEL,
    )
    with BackgroundServer(engine.app()) as server:
        gw = gateway_factory(server.url, tiny_model_dir, MODEL)
        session = gw.create_session()
        for protocol in ("openai", "anthropic"):
            agent = Agent(gw.url, session["token"], protocol)
            for _ in range(3):  # a fork, then calls that refer to the held prompt
                assert agent.turn().status_code == 200
    path = gw.gateway.store.root / session["session_id"] / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    calls = [line for line in lines if json.loads(line)["kind"] == "call"]
    assert len(calls) == 6
    assert any(json.loads(line)["prompt_ref"] for line in calls)
    for line in calls:
        assert CallEntry.model_validate_json(line).model_dump_json().encode() + b"\n" == line
