"""FakeFixedLatencyEngine: a FAKE engine that answers every `/v1/completions` call after a
fixed delay with the same precomputed tool call, in vLLM's token-ID reply shape — whole, or
with `stream: true` as vLLM's stream (one token per chunk, spread over the delay, then the
usage chunk and `[DONE]`), so the gateway's streamed path gets a token stream to relay.

Why a fake: `bench/gateway_load.py` measures what the *gateway* adds per call and how
many calls a gateway process serves, with thousands of sessions at once. A real engine
on this CPU-only machine serves a few calls per second and its latency grows with load,
so it would measure the engine, not the gateway. This one costs almost nothing per call
(a bare ASGI app, no tokenizing per call), so its latency is the fixed delay and
the rest is the gateway. Its reply is a real tool call in the model's own format, tokenized
once at start with the real tokenizer, so the gateway parses it and agents can go on.

`python -m devstack.fixed_latency_engine --tokenizer DIR/tokenizer.json --port P
--latency-ms 50` serves it as its own process.
"""

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

REPLY = (
    "<think>\nList it.\n</think>\n\n<tool_call>\n"
    '{"name": "run", "arguments": {"cmd": "ls -la"}}\n</tool_call>'
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class FakeFixedLatencyEngine:
    """ASGI app: `/v1/completions` (token-ID prompts), `/v1/models`, `/health`."""

    def __init__(
        self,
        tokenizer_file: Path,
        latency_s: float,
        model: str = "tiny",
        eos_token: str = "<|im_end|>",
        max_model_len: int = 32768,
    ) -> None:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"{eos_token!r} is not in the tokenizer")
        self.latency_s = latency_s
        self.model = model
        self.max_model_len = max_model_len
        self.output_ids = [*tokenizer.encode(REPLY, add_special_tokens=False).ids, eos]
        self.logprobs = [-0.1] * len(self.output_ids)
        self.text = REPLY
        self.calls = 0
        starts = [start for start, _ in tokenizer.encode(REPLY, add_special_tokens=False).offsets]
        ends = [*starts[1:], len(REPLY)]
        texts = [REPLY[a:b] for a, b in zip(starts, ends, strict=True)] + [""]  # EOS: no text
        self.stream_chunks = [
            self._chunk(text, token, finish=i == len(texts) - 1)
            for i, (text, token) in enumerate(zip(texts, self.output_ids, strict=True))
        ]

    def _chunk(self, text: str, token: int, finish: bool) -> bytes:
        """One token's stream chunk, made once at start: the gateway reads no `id`."""
        choice = {
            "index": 0,
            "text": text,
            "logprobs": {"token_logprobs": [-0.1]},
            "finish_reason": "stop" if finish else None,
            "stop_reason": None,
            "token_ids": [token],
        }
        body = {"id": "cmpl-stream", "object": "text_completion", "created": 0,
                "model": self.model, "choices": [choice], "usage": None}  # fmt: skip
        return b"data: " + _dumps(body) + b"\n\n"

    def _reply(self, prompt: list[int], max_tokens: int) -> bytes:
        ids, logprobs, finish = self.output_ids, self.logprobs, "stop"
        if len(ids) > max_tokens:
            ids, logprobs, finish = ids[:max_tokens], logprobs[:max_tokens], "length"
        return _dumps(
            {
                "id": f"cmpl-{self.calls}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "text": self.text,
                        "logprobs": {"token_logprobs": logprobs},
                        "finish_reason": finish,
                        "stop_reason": None,
                        "token_ids": ids,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(ids),
                    "total_tokens": len(prompt) + len(ids),
                },
            }
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/v1/completions" and scope["method"] == "POST":
            chunks: list[bytes] = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            try:
                body = json.loads(b"".join(chunks))
                prompt, max_tokens = body["prompt"], int(body.get("max_tokens") or 16)
            except (ValueError, KeyError, TypeError) as exc:
                await _send(send, 400, _dumps({"error": {"message": str(exc)}}))
                return
            self.calls += 1
            if body.get("stream"):
                await self._stream(send, len(prompt), max_tokens)
                return
            await asyncio.sleep(self.latency_s)
            await _send(send, 200, self._reply(prompt, max_tokens))
        elif path == "/v1/models":
            card = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
            await _send(send, 200, _dumps({"object": "list", "data": [card]}))
        elif path == "/health":
            await _send(send, 200, b"{}")
        else:
            await _send(send, 404, b'{"error": {"message": "not found"}}')

    async def _stream(self, send: Send, prompt_tokens: int, max_tokens: int) -> None:
        """The reply token by token, the i-th of n chunks at i/n of the delay: the whole
        stream takes the fixed delay, as the whole reply does."""
        chunks, max_tokens = self.stream_chunks, max(1, max_tokens)
        if len(chunks) > max_tokens:  # cut at max_tokens, the last chunk says so
            last = json.loads(chunks[max_tokens - 1][6:])
            last["choices"][0]["finish_reason"] = "length"
            chunks = [*chunks[: max_tokens - 1], b"data: " + _dumps(last) + b"\n\n"]
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i, chunk in enumerate(chunks):
            await asyncio.sleep(
                max(0.0, started + self.latency_s * (i + 1) / len(chunks) - loop.time())
            )
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(chunks),
                 "total_tokens": prompt_tokens + len(chunks)}  # fmt: skip
        tail = b"data: " + _dumps({"id": "cmpl-stream", "choices": [], "usage": usage})
        await send({"type": "http.response.body", "body": tail + b"\n\ndata: [DONE]\n\n"})


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="fixed-latency FAKE engine on loopback")
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    app = FakeFixedLatencyEngine(args.tokenizer, args.latency_ms / 1000, model=args.model)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", backlog=4096)


if __name__ == "__main__":
    main()
