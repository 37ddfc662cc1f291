"""Real agent CLIs against a recording stand-in LLM server (no Gateway, no model).

Why: until the Gateway speaks every protocol, this proves each harness's *config* is
right — the agent starts, reaches the base URL we gave it, sends our session token and
model name, and (with a scripted reply) completes a tiny task whose result `evaluate`
scores. The server only replays canned replies; it is not a model and not the Gateway.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from devstack.ports import free_port
from harnesses import versions
from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

# --------------------------------------------------------------------------- server


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    protocol: str  # "chat" | "responses" | "messages" | "other"
    at: float = field(default_factory=time.monotonic)

    def bearer_or_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:]
        return self.headers.get("x-api-key")

    def tool_names(self) -> list[str]:
        names = []
        for t in (self.body or {}).get("tools") or []:
            fn = t.get("function") if isinstance(t.get("function"), dict) else t
            if isinstance(fn, dict) and fn.get("name"):
                names.append(fn["name"])
        return names

    def has_tool_result(self) -> bool:
        """True once the agent sent back the result of a tool call we asked for."""
        body = self.body or {}
        if self.protocol == "chat":
            return any(m.get("role") == "tool" for m in body.get("messages", []))
        if self.protocol == "responses":
            return any(
                isinstance(i, dict) and i.get("type") == "function_call_output"
                for i in body.get("input", [])
            )
        if self.protocol == "messages":
            for m in body.get("messages", []):
                content = m.get("content")
                if isinstance(content, list) and any(
                    isinstance(b, dict) and b.get("type") == "tool_result" for b in content
                ):
                    return True
        return False


@dataclass
class Reply:
    """One canned assistant turn: plain text, or one tool call."""

    text: str = "done"
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


Script = Callable[[RecordedRequest], Reply]


class RecordingLLMServerForTests:
    """A stand-in for the Gateway in tests: records every request and replays `script`.

    It speaks just enough of OpenAI Chat Completions (stream and not), OpenAI Responses
    (SSE) and Anthropic Messages (stream and not) for an agent CLI to accept the reply.
    Everything else gets a fast 404 (agents probe a few URLs at startup). It binds to
    127.0.0.1 on a free port and runs in a background thread.
    """

    def __init__(self, script: Script | None = None, context_window: int = 131072) -> None:
        self.script: Script = script or (lambda _r: Reply())
        self.context_window = context_window
        self.requests: list[RecordedRequest] = []
        self.port = free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def model_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.protocol in ("chat", "responses", "messages")]

    def __enter__(self) -> RecordingLLMServerForTests:
        app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "HEAD"])]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("recording server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _handle(self, request: Request) -> Response:
        path = "/" + request.path_params["path"]
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        protocol = "other"
        if request.method == "POST" and path.endswith("/chat/completions"):
            protocol = "chat"
        elif request.method == "POST" and path.endswith("/responses"):
            protocol = "responses"
        elif request.method == "POST" and path.endswith("/messages"):
            protocol = "messages"
        rec = RecordedRequest(
            request.method,
            path,
            {k.lower(): v for k, v in request.headers.items()},
            body,
            protocol,
        )
        self.requests.append(rec)
        if request.method == "GET" and path.rstrip("/").endswith("/v1/models"):
            return JSONResponse(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": "stub-model",
                            "object": "model",
                            "owned_by": "tests",
                            "max_model_len": self.context_window,
                        }
                    ],
                }
            )
        if protocol == "other" or not isinstance(body, dict):
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        reply = self.script(rec)
        model = str(body.get("model", "stub-model"))
        if protocol == "chat":
            return _chat(reply, model, bool(body.get("stream")))
        if protocol == "responses":
            return _responses(reply, model)
        return _messages(reply, model, bool(body.get("stream")))


def _sse(events: list[tuple[str | None, Any]]) -> StreamingResponse:
    async def gen():  # type: ignore[no-untyped-def]
        for name, data in events:
            payload = data if isinstance(data, str) else json.dumps(data)
            yield (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
            await asyncio.sleep(0)

    return StreamingResponse(gen(), media_type="text/event-stream")


def _chat(reply: Reply, model: str, stream: bool) -> Response:
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
    usage = {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}
    tool_calls = None
    if reply.tool:
        tool_calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": reply.tool, "arguments": json.dumps(reply.args)},
            }
        ]
    finish = "tool_calls" if tool_calls else "stop"
    content = None if tool_calls else reply.text
    if not stream:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return JSONResponse(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
        )
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    delta: dict[str, Any] = {"role": "assistant"}
    if tool_calls:
        delta["tool_calls"] = [{"index": 0, **tool_calls[0]}]
    else:
        delta["content"] = content
    events: list[tuple[str | None, Any]] = [
        (None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        (None, {**base, "choices": [], "usage": usage}),
        (None, "[DONE]"),
    ]
    return _sse(events)


def _responses(reply: Reply, model: str) -> Response:
    rid = f"resp_{uuid.uuid4().hex[:12]}"
    if reply.tool:
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:8]}",
            "call_id": f"call_{uuid.uuid4().hex[:8]}",
            "name": reply.tool,
            "arguments": json.dumps(reply.args),
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex[:8]}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
        }
    resp = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": model,
        "output": [],
    }
    usage = {
        "input_tokens": 50,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 55,
    }
    seq = iter(range(100))
    events: list[tuple[str | None, Any]] = [
        ("response.created", {"type": "response.created", "response": resp}),
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {**resp, "status": "completed", "output": [item], "usage": usage},
            },
        ),
    ]
    return _sse([(n, {**d, "sequence_number": next(seq)}) for n, d in events])


def _messages(reply: Reply, model: str, stream: bool) -> Response:
    mid = f"msg_{uuid.uuid4().hex[:12]}"
    if reply.tool:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": f"toolu_{uuid.uuid4().hex[:8]}",
            "name": reply.tool,
            "input": reply.args,
        }
        stop = "tool_use"
    else:
        block = {"type": "text", "text": reply.text}
        stop = "end_turn"
    usage = {"input_tokens": 50, "output_tokens": 5}
    message = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not stream:
        return JSONResponse(message)
    start_block = {**block, "input": {}} if reply.tool else {"type": "text", "text": ""}
    delta = (
        {"type": "input_json_delta", "partial_json": json.dumps(reply.args)}
        if reply.tool
        else {"type": "text_delta", "text": reply.text}
    )
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    **message,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 50, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": start_block},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return _sse(events)


# --------------------------------------------------------------------------- tests

pytestmark = pytest.mark.e2e

TOKEN = "tok-e2e-stub"
MODEL = "stub-policy"
WRITE_HELLO = "printf 'print(42)\\n' > hello.py"
#: Per agent: its shell tool, how it wants the command argument, how it finishes.
AGENTS: dict[str, dict[str, Any]] = {
    "mini_swe_agent": {"tool": "bash", "arg": "command", "finish": "bash"},
    "hermes": {"tool": "terminal", "arg": "command", "finish": "text"},
    "codex": {"tool": "exec_command", "arg": "cmd", "finish": "text"},
    "claude_code": {"tool": "Bash", "arg": "command", "finish": "text"},
}


def solve_hello(agent: str) -> Script:
    """Scripted 'model': call the agent's own shell tool to write hello.py, then finish
    the way that agent expects (mini: its submit command; others: a plain answer)."""
    spec = AGENTS[agent]

    def script(r: RecordedRequest) -> Reply:
        if spec["tool"] not in r.tool_names():
            return Reply(text="done")  # an auxiliary call (title, summary...)
        if not r.has_tool_result():
            args = {spec["arg"]: WRITE_HELLO}
            if agent == "claude_code":
                args["description"] = "Write hello.py"
            return Reply(tool=spec["tool"], args=args)
        if spec["finish"] == "bash":
            return Reply(
                tool="bash", args={"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
            )
        return Reply(text="hello.py now prints 42")

    return script


@pytest.fixture
def backend(sandbox_backend: SandboxBackend) -> SandboxBackend:  # noqa: F811
    """Local (bubblewrap on the image rootfs) and docker in turn; both hold the agents."""
    return sandbox_backend


@pytest.fixture
def llm() -> Iterator[RecordingLLMServerForTests]:
    with RecordingLLMServerForTests() as srv:
        yield srv


def hello_task(agent: str, backend: str) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": f"hello-{agent}",
            "prompt": "Create hello.py in the current directory that prints 42.",
            "sandbox": {"backend": backend},
            "harness": {
                "name": agent,
                "config": {"model": MODEL, "context_window": 32768, "max_output_tokens": 1024},
                "budget_s": 240,
            },
            "evaluation": {
                "checks": [{"kind": "command", "command": 'test "$(python3 hello.py)" = 42'}]
            },
        }
    )


PINNED = {
    "claude_code": versions.CLAUDE_CODE_VERSION,
    "codex": versions.CODEX_VERSION,
    "hermes": versions.HERMES_VERSION,
    "mini_swe_agent": versions.MINI_SWE_AGENT_VERSION,
}
#: Transcript each agent must leave behind (collected by the collect_logs hook).
TRANSCRIPT_KIND = {
    "claude_code": "transcript",
    "codex": "transcript",
    "hermes": "log",
    "mini_swe_agent": "trajectory",
}


@pytest.mark.parametrize("agent", list(AGENTS))
async def test_real_agent_solves_hello_against_stand_in(
    agent: str, backend: SandboxBackend, llm: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    """Config correctness end to end: the real CLI, inside the sandbox, reaches the
    URL we configured with our token and model, runs the scripted tool call, and the
    task's success check scores its work."""
    llm.script = solve_hello(agent)
    session = SessionCreated(
        session_id="s-e2e",
        token=TOKEN,
        openai_base_url=f"{llm.url}/v1",
        anthropic_base_url=llm.url,
    )
    rid = f"e2e-stub-{agent}-{backend.name}-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(
        hello_task(agent, backend.name), session, rid
    )
    calls = llm.model_requests()
    assert r.agent is not None
    diag = f"stdout={r.agent.stdout_tail[-1500:]}\nstderr={r.agent.stderr_tail[-1500:]}"
    assert calls, f"{agent} made no model call\n{diag}"
    first = calls[0]
    assert first.bearer_or_key() == TOKEN, diag
    assert (first.body or {}).get("model") == MODEL, diag
    want_protocol = {"claude_code": "messages", "codex": "responses"}.get(agent, "chat")
    assert {c.protocol for c in calls} == {want_protocol}
    assert first.path.startswith("/v1/")
    assert r.status == RolloutStatus.ok, f"{r.status} {r.error}\n{diag}"
    assert r.reward == 1.0, diag
    assert r.harness_version == PINNED[agent]
    kinds = {lf.kind for lf in r.agent.logs}
    assert TRANSCRIPT_KIND[agent] in kinds, kinds
    if agent == "claude_code":
        assert first.headers.get("x-claude-code-request-class") == "main"
        assert (first.body or {}).get("max_tokens") == 1024
    if agent == "codex":
        assert "x-codex-turn-metadata" in first.headers
        assert r.agent.final_message == "hello.py now prints 42"
    if agent == "hermes":
        assert (first.body or {}).get("max_tokens") == 1024
    if agent == "mini_swe_agent":
        assert r.agent.details.get("exit_status") == "Submitted"
