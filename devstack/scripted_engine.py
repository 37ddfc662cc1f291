"""ScriptedEngine: a FAKE LLM engine that follows a script, speaking vLLM's token API.

Why a fake: agent end-to-end tests need an LLM that reliably calls the right tools, which
no model that runs here can do. Everything else stays real: the reply text is tokenized
with the real tokenizer, token IDs and per-token logprobs come back in exactly the shape
vLLM's `/v1/completions` uses (`choices[0].token_ids`, `choices[0].logprobs.token_logprobs`,
the end-of-turn token included when the reply stops), and `max_tokens` truncates.
A reply that already writes one of the model's end-of-turn tokens (`stop_tokens`: e.g.
gpt-oss's `<|call|>` after a tool call, `<|return|>` after an answer) ends right after the
first of them, as vLLM stops on any of its generation config's eos ids; any other reply
gets `eos_token` appended.
Rules are consumed in order: the first unused rule whose `when_contains` occurs in the
decoded prompt answers; when none is left the `default_reply` is used. Every answer is
kept in `replies` (prompt IDs, the returned IDs and logprobs, which rule answered), so
tests can compare what a Gateway recorded with what the engine really sampled; with
`log_path` each answer is also appended there as a JSON line before it is sent, so the
comparison survives the engine process being killed (`python -m devstack.scripted_engine`
runs it as its own process). A `{nonce}` in a reply becomes a fresh random word per answer,
so no two answers are alike and a sample cannot match the wrong one.

It also answers vLLM's token-in/token-out `/inference/v1/generate` (tokens mode), and
there, when told to (`routing`), returns SCRIPTED routed experts in vLLM's wire shape
(base64 `.npy`, (tokens - 1 - routed_experts_prompt_start, layers, top_k)): ids made up
from each token, its position and the layer, not a model's router. They exercise the
Gateway's capture path; real routing comes from a real MoE model.
"""

import argparse
import asyncio
import base64
import io
import itertools
import json
import secrets
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer


class ScriptRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reply: str
    when_contains: str | None = None
    repeat: bool = False


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[ScriptRule] = Field(default_factory=list)
    default_reply: str = "Done."


class ScriptedReply(BaseModel):
    """One answer of the engine, as returned on the wire."""

    model_config = ConfigDict(extra="forbid")

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    #: Index of the script rule that answered; None for the default reply.
    rule: int | None


class CompletionsBody(BaseModel):
    """The subset of vLLM's completions request the Gateway sends; the rest is accepted."""

    model_config = ConfigDict(extra="allow")

    prompt: list[int] = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)
    model: str | None = None
    stream: bool = False


class GenerateBody(BaseModel):
    """The subset of vLLM's generate request the Gateway sends; the rest is accepted."""

    model_config = ConfigDict(extra="allow")

    token_ids: list[int] = Field(min_length=1)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    stream: bool = False


class ScriptedRouting(BaseModel):
    """SCRIPTED routed experts for the generate endpoint (not a model's router): expert
    `(token * 7 + position * 3 + layer * 5 + slot + shift) % experts`, `shift` 1 on the
    prompt when `reread_shift` (so a token re-read as prompt is routed otherwise than when
    it was sampled). `fault` makes it misbehave: `none` sends no routing, `rows` one row
    too few, `layers` one layer too many, `garbage` a body that is no `.npy`."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(default=2, ge=1)
    top_k: int = Field(default=2, ge=1)
    experts: int = Field(default=8, ge=1)
    reread_shift: bool = False
    fault: Literal["none", "rows", "layers", "garbage"] | None = None

    def rows(self, sequence: list[int], prompt_len: int, start: int) -> np.ndarray:
        """The routing of `sequence[start:-1]` (prompt then output)."""
        positions = np.arange(start, len(sequence) - 1)
        tokens = np.asarray(sequence[start:-1], dtype=np.int64)
        shift = (positions < prompt_len) if self.reread_shift else np.zeros_like(positions)
        base = tokens * 7 + positions * 3 + shift
        layer = np.arange(self.layers)[None, :, None] * 5
        slot = np.arange(self.top_k)[None, None, :]
        return ((base[:, None, None] + layer + slot) % self.experts).astype(np.int32)

    def wire(self, sequence: list[int], prompt_len: int, start: int) -> str | None:
        """`routed_experts` as vLLM sends it (or as `fault` spoils it)."""
        if self.fault == "none":
            return None
        if self.fault == "garbage":
            return base64.b64encode(b"not an npy array").decode("ascii")
        rows = self.rows(sequence, prompt_len, start)
        if self.fault == "rows":
            rows = rows[:-1]
        elif self.fault == "layers":
            rows = np.concatenate([rows, rows[:, :1]], axis=1)
        with io.BytesIO() as buffer:
            np.save(buffer, rows, allow_pickle=False)
            return base64.b64encode(buffer.getvalue()).decode("ascii")


class ScriptedEngine:
    """A scripted stand-in for vLLM. Thread-safe; records every prompt it was sent."""

    def __init__(
        self,
        tokenizer_path: Path,
        script: Script,
        eos_token: str = "<|im_end|>",
        model: str = "tiny",
        max_model_len: int = 32768,
        delay_s: float = 0.0,
        log_path: Path | None = None,
        stop_tokens: Sequence[str] = (),
    ) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        eos_id = self.tokenizer.token_to_id(eos_token)
        if eos_id is None:
            raise ValueError(f"end-of-turn token {eos_token!r} is not in the tokenizer")
        self.eos_id: int = eos_id
        stop_ids = {self.tokenizer.token_to_id(t): t for t in stop_tokens}
        if None in stop_ids:
            raise ValueError(f"a stop token of {list(stop_tokens)} is not in the tokenizer")
        self.stop_ids: frozenset[int] = frozenset(i for i in stop_ids if i is not None)
        self.script = script
        self.model = model
        self.max_model_len = max_model_len
        #: Seconds each completion takes before it answers (a slow engine, for client
        #: timeouts and retries); may be changed while serving.
        self.delay_s = delay_s
        #: Generation pauses after this many tokens until `release` is set (None: never):
        #: a stream has sent them, a plain reply waits for the end. Lets a test look at a
        #: stream while it is mid-generation.
        self.hold_after_tokens: int | None = None
        self.release = threading.Event()
        #: Streams send this many tokens, then an in-stream error as vLLM does when a
        #: request fails mid-generation (None: never).
        self.fail_after_tokens: int | None = None
        #: Streams whose client left before the last token was sent (vLLM aborts those).
        self.streams_cancelled = 0
        #: What the generate endpoint returns as routed experts (None: none, as a vLLM
        #: started without --enable-return-routed-experts); may be changed while serving.
        self.routing: ScriptedRouting | None = None
        #: Each generate request's `routed_experts_prompt_start` (None: not sent).
        self.routing_starts: list[int | None] = []
        self.prompts: list[list[int]] = []
        self.replies: list[ScriptedReply] = []
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self._log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115

    def reset(self, script: Script | None = None) -> None:
        """Start over (optionally with a new script): every rule unused, nothing recorded."""
        with self._lock:
            if script is not None:
                self.script = script
            self._used.clear()
            self.prompts.clear()
            self.replies.clear()

    def _choose(self, prompt_text: str) -> tuple[str, int | None]:
        with self._lock:
            for index, rule in enumerate(self.script.rules):
                if index in self._used:
                    continue
                if rule.when_contains is None or rule.when_contains in prompt_text:
                    if not rule.repeat:
                        self._used.add(index)
                    return rule.reply, index
            return self.script.default_reply, None

    def complete(self, body: CompletionsBody) -> dict[str, Any]:
        with self._lock:
            self.prompts.append(list(body.prompt))
        prompt_text = self.tokenizer.decode(body.prompt, skip_special_tokens=False)
        reply, rule = self._choose(prompt_text)
        reply = reply.replace("{nonce}", "n" + secrets.token_hex(3))
        ids = self.tokenizer.encode(reply, add_special_tokens=False).ids
        end = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
        ids = [*ids, self.eos_id] if end is None else ids[: end + 1]
        finish = "stop"
        if len(ids) > body.max_tokens:
            ids, finish = ids[: body.max_tokens], "length"
        logprobs = [-round(0.05 * ((i % 9) + 1), 4) for i in range(len(ids))]
        answer = ScriptedReply(
            prompt_ids=list(body.prompt),
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=finish,
            rule=rule,
        )
        with self._lock:
            self.replies.append(answer)
            if self._log is not None:
                self._log.write(answer.model_dump_json() + "\n")
                self._log.flush()
        return self._reply_body(ids, logprobs, finish, len(body.prompt))

    def _reply_body(
        self, ids: list[int], logprobs: list[float], finish: str | None, prompt_tokens: int
    ) -> dict[str, Any]:
        tokens = [self.tokenizer.id_to_token(i) or "" for i in ids]
        offsets = list(itertools.accumulate((len(t) for t in tokens), initial=0))[:-1]
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "text": self.tokenizer.decode(ids, skip_special_tokens=True),
                    "logprobs": {
                        "text_offset": offsets,
                        "token_logprobs": logprobs,
                        "tokens": tokens,
                        "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],
                    },
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": ids,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(ids),
                "total_tokens": prompt_tokens + len(ids),
            },
        }

    def generate(self, body: GenerateBody) -> dict[str, Any]:
        """vLLM's generate reply (tokens mode) to the same script, with the routing told."""
        params = body.sampling_params
        start = params.get("routed_experts_prompt_start")
        with self._lock:
            self.routing_starts.append(start)
        asked = CompletionsBody(
            prompt=body.token_ids, max_tokens=params.get("max_tokens", 16), stream=body.stream
        )
        answer = self.complete(asked)
        choice = answer["choices"][0]
        ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        routing = self.routing
        routed = (
            routing.wire([*body.token_ids, *ids], len(body.token_ids), start or 0)
            if routing is not None
            else None
        )
        content = [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)]
        return {
            "request_id": f"generate-tokens-{uuid.uuid4().hex}",
            "choices": [
                {
                    "index": 0,
                    "token_ids": ids,
                    "logprobs": {"content": content},
                    "finish_reason": choice["finish_reason"],
                    "stop_reason": None,
                    "routed_experts": routed,
                }
            ],
            "usage": answer["usage"],
        }

    @staticmethod
    async def generate_chunks(answer: dict[str, Any]) -> Any:
        """The generate answer as vLLM streams it: one token per chunk, the finish reason
        and the whole call's routed experts in the last, then usage and `[DONE]`."""
        choice = answer["choices"][0]
        ids, content = choice["token_ids"], choice["logprobs"]["content"]
        for i, (token, entry) in enumerate(zip(ids, content, strict=True)):
            last = i == len(ids) - 1
            part = {
                "index": 0,
                "token_ids": [token],
                "logprobs": {"content": [entry]},
                "finish_reason": choice["finish_reason"] if last else None,
                "routed_experts": choice["routed_experts"] if last else None,
            }
            yield f"data: {json.dumps({'request_id': answer['request_id'], 'choices': [part]})}\n\n"
        usage = {"request_id": answer["request_id"], "choices": [], "usage": answer["usage"]}
        yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"

    async def stream_chunks(self, body: CompletionsBody, answer: dict[str, Any]) -> Any:
        """The answer as vLLM streams it: one token per `data:` chunk (the prompt ids in the
        first), the finish reason in the last, then a usage chunk and `[DONE]`."""
        choice = answer["choices"][0]
        ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        sent = 0
        try:
            for i, (token, logprob) in enumerate(zip(ids, logprobs, strict=True)):
                if self.hold_after_tokens is not None and i == self.hold_after_tokens:
                    while not self.release.is_set():
                        await asyncio.sleep(0.01)
                if i == self.fail_after_tokens:
                    error = {"message": "engine failed mid-generation", "type": "Internal"}
                    yield f"data: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n"
                    return
                last = i == len(ids) - 1
                chunk = self._reply_body([token], [logprob], None, len(body.prompt))
                del chunk["usage"]
                part = chunk["choices"][0]
                part["finish_reason"] = choice["finish_reason"] if last else None
                if i == 0:
                    part["prompt_token_ids"] = list(body.prompt)
                yield f"data: {json.dumps(chunk)}\n\n"
                sent += 1
            usage = {**answer, "choices": [], "usage": answer["usage"]}
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
        finally:
            if sent < len(ids):
                with self._lock:
                    self.streams_cancelled += 1

    def app(self) -> Starlette:
        async def completions(request: Request) -> Response:
            try:
                body = CompletionsBody.model_validate(await request.json())
            except (ValidationError, ValueError) as exc:
                return JSONResponse({"error": {"message": str(exc), "code": 400}}, 400)
            answer = self.complete(body)  # recorded now: `prompts` shows it is in flight
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            if body.stream:
                return StreamingResponse(
                    self.stream_chunks(body, answer), media_type="text/event-stream"
                )
            if self.hold_after_tokens is not None:
                # Not streamed: the reply leaves once the whole generation is done.
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            return JSONResponse(answer)

        async def generate(request: Request) -> Response:
            try:
                body = GenerateBody.model_validate(await request.json())
            except (ValidationError, ValueError) as exc:
                return JSONResponse({"error": {"message": str(exc), "code": 400}}, 400)
            answer = self.generate(body)
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            if body.stream:
                return StreamingResponse(
                    self.generate_chunks(answer), media_type="text/event-stream"
                )
            return JSONResponse(answer)

        async def models(request: Request) -> JSONResponse:
            entry = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
            return JSONResponse({"object": "list", "data": [entry]})

        async def health(request: Request) -> JSONResponse:
            return JSONResponse({})

        return Starlette(
            routes=[
                Route("/v1/completions", completions, methods=["POST"]),
                Route("/inference/v1/generate", generate, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
            ]
        )


def read_log(path: Path) -> list[ScriptedReply]:
    """The answers an engine with `log_path` gave (a line torn by a kill is skipped: its
    answer was never sent)."""
    replies: list[ScriptedReply] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            replies.append(ScriptedReply.model_validate_json(line))
        except ValidationError:
            continue
    return replies


def main() -> None:
    """Serve a scripted engine as its own process (so a test can SIGKILL it)."""
    import uvicorn

    parser = argparse.ArgumentParser(description="scripted (FAKE) engine on loopback")
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json")
    parser.add_argument("--script", type=Path, required=True, help="Script as JSON")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--log", type=Path, default=None, help="append each answer here")
    parser.add_argument("--eos-token", default="<|im_end|>", help="token every reply ends with")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="wait before each answer")
    args = parser.parse_args()
    script = Script.model_validate(json.loads(args.script.read_text()))
    engine = ScriptedEngine(
        args.tokenizer,
        script,
        eos_token=args.eos_token,
        model=args.model,
        log_path=args.log,
        delay_s=args.delay_ms / 1000,
    )
    uvicorn.run(engine.app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
