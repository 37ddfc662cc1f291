"""Time to first token through the Gateway's live stream against vLLM's own streaming chat,
side by side in one run.

The same multi-turn tool conversations as `gateway_overhead.py` (reply format forced by
vLLM structured outputs, each path feeding its own replies back), every call streamed:
(a) straight to vLLM's `/v1/chat/completions`, (b) through a `rollout gateway` process in
front of the same vLLM, in each protocol; the paths take turns call by call, so a load
that comes and goes on a shared box hits them alike. TTFT is the time from sending a request to the
first event that carries sampled text (reasoning, content or a tool call), as a client
sees it; the role-only first chunk does not count. Prints p50/p99 TTFT and the ratio to
vLLM's, and the whole call's p50 for reference.

vLLM's chat (no reasoning parser) streams the `<think>` tag and the newline after it as
content, one token each, while the Gateway sends reasoning as reasoning, without the tag:
its first event is the first reasoning character, two decode steps later. So a second
baseline, "vLLM first text", times vLLM's own stream to its first text that is neither
the `<think>` tag nor whitespace: the point of the reply the Gateway's first event shows.

Run: `python -m bench.gateway_streaming [--conversations 4] [--turns 20]`.
"""

import argparse
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from bench.common import GatewayProcess, percentile
from bench.conversations import (
    REGEX,
    VLLM_ARGS,
    Conversation,
    MessagesConversation,
    ResponsesConversation,
    new_sessions,
)
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig


def sse_data(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            yield json.loads(line[5:])


class Marks:
    """When a streamed call's first event with sampled text arrived, and its first event
    with visible text (not the `<think>` tag, not whitespace)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.first_text: float | None = None

    def event(self, text: str = "") -> None:
        now = time.perf_counter()
        self.first = self.first or now
        if text.strip():
            self.first_text = self.first_text or now


def chat_stream(events: Iterator[dict[str, Any]], marks: Marks) -> dict[str, Any]:
    """Chat chunks → the `chat.completion` shape `Conversation.absorb` reads."""
    content, calls = "", {}
    for chunk in events:
        if not chunk.get("choices"):
            continue
        delta = chunk["choices"][0]["delta"]
        reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        if delta.get("content") or reasoning:
            marks.event(reasoning + content.removeprefix("<think>"))
        for tc in delta.get("tool_calls") or []:
            marks.event("tool call")
            call = calls.setdefault(tc["index"], {"type": "function", "function": {}})
            call["id"] = tc.get("id") or call.get("id")
            fn = tc.get("function") or {}
            call["function"]["name"] = fn.get("name") or call["function"].get("name")
            args = call["function"].get("arguments", "") + (fn.get("arguments") or "")
            call["function"]["arguments"] = args
    message = {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}
    return {"choices": [{"message": message}]}


def responses_stream(events: Iterator[dict[str, Any]], marks: Marks) -> dict[str, Any]:
    final: dict[str, Any] = {}
    for event in events:
        if event["type"].endswith(".delta"):
            marks.event(event.get("delta") or "")
        if event["type"] in ("response.completed", "response.incomplete"):
            final = event["response"]
    return final


def messages_stream(events: Iterator[dict[str, Any]], marks: Marks) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] != "signature_delta":
                text = delta.get("text") or delta.get("thinking") or delta.get("partial_json")
                marks.event(text or "")
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and event["index"] in partial:
            blocks[event["index"]]["input"] = json.loads(partial[event["index"]])
    return {"content": blocks}


READERS: dict[str, Callable[[Iterator[dict[str, Any]], Marks], dict[str, Any]]] = {
    "/chat/completions": chat_stream,
    "/responses": responses_stream,
    "/messages": messages_stream,
}


class Path:
    """One way to reach the model, with its conversations and what they measured."""

    def __init__(
        self,
        name: str,
        url: str,
        headers_for: list[dict[str, str]],
        make: Callable[[], Conversation],
    ) -> None:
        self.name, self.url, self.headers_for = name, url, headers_for
        self.conversations = [make() for _ in headers_for]
        self.ttfts: list[float] = []
        self.text_ttfts: list[float] = []
        self.totals: list[float] = []

    def turn(self, client: httpx.Client, model: str, turn: int) -> None:
        """Turn `turn` of every conversation, each call streamed."""
        for conv, headers in zip(self.conversations, self.headers_for, strict=True):
            body = {**conv.body(model), "stream": True}
            marks = Marks()
            t0 = time.perf_counter()
            with client.stream("POST", f"{self.url}{conv.path}", json=body, headers=headers) as r:
                r.raise_for_status()
                reply = READERS[conv.path](sse_data(r.iter_lines()), marks)
            self.totals.append(time.perf_counter() - t0)
            assert marks.first is not None and marks.first_text is not None, reply
            self.ttfts.append(marks.first - t0)
            self.text_ttfts.append(marks.first_text - t0)
            conv.absorb(reply, turn)


def run_interleaved(paths: list[Path], model: str, turns: int) -> None:
    """Turn t on every path, then turn t+1: each path sees the same load on a shared box."""
    with httpx.Client(timeout=300) as client:
        for turn in range(turns):
            for path in paths:
                path.turn(client, model, turn)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    model_dir = ensure_tiny_model()
    with VllmServer(VllmServerConfig(model_dir=model_dir, extra_args=VLLM_ARGS)) as vllm:
        gateway = GatewayProcess(vllm, model_dir)
        gw, control, admin = gateway.url, gateway.control, gateway.admin
        try:
            direct = f"{vllm.url}/v1"
            plain: list[dict[str, str]] = [{} for _ in range(args.conversations)]

            def make_direct() -> Conversation:
                return Conversation(direct=True)

            run_interleaved([Path("warm-up", direct, plain[:1], make_direct)], vllm.model, 2)
            paths = [Path("vLLM /v1/chat/completions", direct, plain, make_direct)]
            for name, make, header in [
                ("gateway /v1/chat/completions", Conversation, "Authorization"),
                ("gateway /v1/responses", ResponsesConversation, "Authorization"),
                ("gateway /v1/messages", MessagesConversation, "x-api-key"),
            ]:
                tokens = new_sessions(control, admin, args.conversations)
                headers = [
                    {header: f"Bearer {t}" if header == "Authorization" else t} for t in tokens
                ]
                paths.append(Path(name, f"{gw}/v1", headers, make))
            run_interleaved(paths, vllm.model, args.turns)
        finally:
            gateway.stop()
    direct_path = paths[0]
    rows = [(p.name, p.ttfts, p.totals) for p in paths]
    rows.insert(1, ("vLLM first text", direct_path.text_ttfts, direct_path.totals))
    print(
        f"{args.conversations} conversations x {args.turns} turns per path, all streamed; "
        f"regex {REGEX[:24]}...; ratios vs vLLM's own streaming chat (its first event; "
        "x text: its first text after <think>)"
    )
    print(
        f"{'path':<30}{'TTFT p50':>10}{'p99':>9}{'p50 x':>7}{'p99 x':>7}{'x text':>8}"
        f"{'call p50':>10}"
    )
    base50, base99 = percentile(rows[0][1], 0.5), percentile(rows[0][1], 0.99)
    text50 = percentile(rows[1][1], 0.5)
    for name, ttft, total in rows:
        p50, p99 = percentile(ttft, 0.5), percentile(ttft, 0.99)
        print(
            f"{name:<30}{p50 * 1000:>8.1f}ms{p99 * 1000:>7.1f}ms{p50 / base50:>7.2f}"
            f"{p99 / base99:>7.2f}{p50 / text50:>8.2f}{percentile(total, 0.5) * 1000:>8.1f}ms"
        )


if __name__ == "__main__":
    main()
