"""vLLM's replies, validated and mapped onto one `EngineCompletion`.

An engine reply is external input: a silently misaligned logprob would poison training
data rather than fail loudly, so every reply shape (`/v1/completions`, whole or streamed,
and the token-in/token-out `/inference/v1/generate`) ends in the same checks
(`extract_completion`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, TypeVar

import orjson
from pydantic import Field, ValidationError

from gateway.engines.base import EngineCompletion
from gateway.errors import GatewayError
from gateway.protocols.wire import ReplyWire, validation_summary

_Wire = TypeVar("_Wire", bound=ReplyWire)


# --- vLLM wire models (validation of external input) ------------------------------------


class _VllmLogprobs(ReplyWire):
    token_logprobs: list[float | None]
    tokens: list[str] | None = None


class _VllmChoice(ReplyWire):
    index: int = 0
    text: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: _VllmLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    routed_experts: str | None = None
    """The generate endpoint's routing (base64 `.npy`, `routed_experts`); kept, not read."""


class _VllmPromptTokensDetails(ReplyWire):
    cached_tokens: int | None = None


class _VllmUsage(ReplyWire):
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_details: _VllmPromptTokensDetails | None = None


class VllmCompletionReply(ReplyWire):
    choices: list[_VllmChoice] = Field(min_length=1)
    usage: _VllmUsage | None = None


class _VllmModelCard(ReplyWire):
    id: str
    max_model_len: int | None = None


class VllmModelList(ReplyWire):
    data: list[_VllmModelCard]


def bad_reply(url: str, what: str) -> GatewayError:
    return GatewayError("engine_bad_reply", f"engine at {url} returned a malformed reply: {what}")


TOKEN_IDS_NEEDED = (
    "it ignores `return_token_ids` (vLLM before 0.10.2, or another "
    "server); the Gateway records each call's sampled ids exactly and cannot sample without "
    "them: serve the model with vLLM >= 0.10.2"
)
LOGPROBS_NEEDED = (
    "it ignores `logprobs` or has them turned off (vLLM "
    "`--max-logprobs 0`); a trainer needs the behaviour logprob of every sampled token"
)


def missing_capability(url: str, what: str, field: str, detail: str) -> GatewayError:
    """The engine answers, but without something the Gateway cannot do without: the
    error names it and what offers it (a trainer's own inference server often differs
    from a plain `vllm serve`)."""
    return GatewayError(
        "engine_bad_reply", f"engine at {url} does not return {what} (no {field}): {detail}"
    )


def validate_reply(url: str, wire: type[_Wire], content: bytes) -> _Wire:
    """`content` parsed as `wire`, or the engine_bad_reply that says what is wrong."""
    try:
        return wire.model_validate_json(content)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            raise bad_reply(url, "body is not JSON") from exc
        raise bad_reply(url, validation_summary(exc)) from exc


def extract_completion(
    url: str, prompt_ids: list[int], reply: VllmCompletionReply
) -> EngineCompletion:
    """The one place that maps vLLM's completion reply onto `EngineCompletion`.

    vLLM field → ours:
      choices[0].token_ids                 → output_ids   (needs `return_token_ids: true`)
      choices[0].logprobs.token_logprobs   → output_logprobs (sampled token's logprob)
      choices[0].prompt_token_ids          → checked equal to what we sent, if present
      choices[0].finish_reason/stop_reason → finish_reason/stop_reason
      usage.prompt_tokens_details.cached_tokens → cached_prompt_tokens (0 if absent)
    """
    choice = reply.choices[0]
    if choice.token_ids is None:
        raise missing_capability(url, "sampled token ids", "choices[0].token_ids", TOKEN_IDS_NEEDED)
    if choice.logprobs is None:
        raise missing_capability(
            url, "logprobs of the sampled tokens", "choices[0].logprobs", LOGPROBS_NEEDED
        )
    output_ids = choice.token_ids
    raw_logprobs = choice.logprobs.token_logprobs
    if len(raw_logprobs) != len(output_ids):
        raise bad_reply(
            url,
            f"{len(output_ids)} token_ids but {len(raw_logprobs)} token_logprobs",
        )
    if choice.logprobs.tokens is not None and len(choice.logprobs.tokens) != len(output_ids):
        raise bad_reply(
            url, f"{len(output_ids)} token_ids but {len(choice.logprobs.tokens)} logprob tokens"
        )
    output_logprobs: list[float] = []
    for i, lp in enumerate(raw_logprobs):
        if lp is None or not math.isfinite(lp):
            raise bad_reply(url, f"token_logprobs[{i}] is {lp!r}")
        output_logprobs.append(float(lp))
    if any(t < 0 for t in output_ids):
        raise bad_reply(url, "negative token id in choices[0].token_ids")
    if choice.prompt_token_ids is not None and choice.prompt_token_ids != prompt_ids:
        raise bad_reply(url, "choices[0].prompt_token_ids differ from the prompt sent")
    if choice.finish_reason not in ("stop", "length"):
        raise bad_reply(url, f"unexpected finish_reason {choice.finish_reason!r}")

    prompt_tokens = len(prompt_ids)
    completion_tokens = len(output_ids)
    cached = 0
    if reply.usage is not None:
        if reply.usage.completion_tokens != completion_tokens:
            raise bad_reply(
                url,
                f"usage.completion_tokens={reply.usage.completion_tokens} "
                f"but {completion_tokens} token_ids",
            )
        if reply.usage.prompt_tokens != prompt_tokens:
            raise bad_reply(
                url,
                f"usage.prompt_tokens={reply.usage.prompt_tokens} "
                f"but {prompt_tokens} prompt ids were sent",
            )
        details = reply.usage.prompt_tokens_details
        if details is not None and details.cached_tokens is not None:
            cached = details.cached_tokens
    return EngineCompletion(
        url=url,
        output_ids=output_ids,
        output_logprobs=output_logprobs,
        text=choice.text,
        finish_reason=choice.finish_reason,  # type: ignore[arg-type]  # narrowed above
        stop_reason=choice.stop_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=cached,
    )


class _VllmStreamChunk(ReplyWire):
    choices: list[_VllmChoice] = Field(default_factory=list)
    usage: _VllmUsage | None = None


class StreamMerge:
    """Folds vLLM's completion stream (`data:` lines, then `data: [DONE]`) into the one reply
    a non-stream call gets, so `extract_completion` validates both the same way."""

    chunk_wire: ClassVar[type[ReplyWire]] = _VllmStreamChunk

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: list[int] = []
        self.logprobs: list[float | None] = []
        self.tokens: list[str] | None = []
        self.text: list[str] = []
        self.prompt_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.routed_experts: str | None = None
        self.usage: _VllmUsage | None = None
        self.done = False

    def line(self, line: str) -> tuple[list[int], list[float]] | None:
        """One line of the stream → the sampled (ids, logprobs) it carries, if any."""
        if not line.startswith("data:"):
            return None  # blank separators, comments, `event:` lines
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return None
        try:
            body = orjson.loads(data)  # the first chunk echoes the prompt: C speed
        except orjson.JSONDecodeError as exc:
            raise bad_reply(self.url, "a stream chunk is not JSON") from exc
        if isinstance(body, dict) and ("error" in body or body.get("object") == "error"):
            error = body.get("error", body)  # vLLM has used both shapes
            message = error.get("message") if isinstance(error, dict) else error
            raise bad_reply(self.url, f"error mid-stream: {message}")
        return self._chunk(body)

    def _chunk(self, body: object) -> tuple[list[int], list[float]] | None:
        try:
            chunk = self.chunk_wire.model_validate(body)
        except ValidationError as exc:
            raise bad_reply(self.url, validation_summary(exc)) from exc
        if chunk.usage is not None:
            self.usage = chunk.usage
        if not chunk.choices:
            return None
        return self._choice(self._completion_choice(chunk))

    def _completion_choice(self, chunk: Any) -> _VllmChoice:
        return chunk.choices[0]

    def _choice(self, choice: _VllmChoice) -> tuple[list[int], list[float]]:
        if choice.prompt_token_ids is not None:
            self.prompt_ids = choice.prompt_token_ids
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
            self.stop_reason = choice.stop_reason
        if choice.routed_experts is not None:  # vLLM sends it once, on the final chunk
            self.routed_experts = choice.routed_experts
        self.text.append(choice.text)
        ids = choice.token_ids or []
        logprobs = choice.logprobs.token_logprobs if choice.logprobs is not None else []
        if len(logprobs) != len(ids) or any(lp is None for lp in logprobs):
            raise bad_reply(
                self.url, f"a stream chunk has {len(ids)} token_ids but logprobs {logprobs}"
            )
        if self.tokens is not None and choice.logprobs is not None and choice.logprobs.tokens:
            self.tokens.extend(choice.logprobs.tokens)
        elif ids:
            self.tokens = None  # not every chunk names its tokens: do not check them
        self.ids.extend(ids)
        self.logprobs.extend(logprobs)
        return ids, [float(lp) for lp in logprobs if lp is not None]

    def reply(self) -> VllmCompletionReply:
        if not self.done:
            raise bad_reply(self.url, "the stream ended without [DONE]")
        choice = _VllmChoice(
            text="".join(self.text),
            token_ids=self.ids,
            prompt_token_ids=self.prompt_ids,
            logprobs=_VllmLogprobs(token_logprobs=self.logprobs, tokens=self.tokens),
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            routed_experts=self.routed_experts,
        )
        return VllmCompletionReply(choices=[choice], usage=self.usage)


# --- /inference/v1/generate (token in, token out) ----------------------------------------

NO_LOGPROB = -9999.0
"""What vLLM's generate endpoint sends for a sampled token it has no logprob for (or NaN)."""


class _GenerateLogprob(ReplyWire):
    token_id: int
    logprob: float


class _GenerateLogprobs(ReplyWire):
    content: list[_GenerateLogprob] | None = None


class _GenerateChoice(ReplyWire):
    index: int = 0
    token_ids: list[int] | None = None
    logprobs: _GenerateLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    routed_experts: str | None = None


class GenerateReply(ReplyWire):
    choices: list[_GenerateChoice] = Field(min_length=1)
    usage: _VllmUsage | None = None
    prompt_token_ids: list[int] | None = None


class _GenerateStreamChunk(ReplyWire):
    choices: list[_GenerateChoice] = Field(default_factory=list)
    usage: _VllmUsage | None = None
    prompt_token_ids: list[int] | None = None


def _as_completion_choice(
    url: str, choice: _GenerateChoice, prompt_ids: list[int] | None
) -> _VllmChoice:
    """A generate choice in the completions shape; each logprob entry must name the token
    it belongs to, and carry a real logprob."""
    ids = choice.token_ids
    logprobs = None
    if choice.logprobs is not None and choice.logprobs.content is not None:
        entries = choice.logprobs.content
        if ids is not None and [e.token_id for e in entries] != ids:
            raise bad_reply(url, "logprobs.content token ids differ from choices[0].token_ids")
        for i, entry in enumerate(entries):
            if entry.logprob <= NO_LOGPROB:
                raise bad_reply(url, f"no logprob for sampled token {i} ({entry.token_id})")
        logprobs = _VllmLogprobs(token_logprobs=[e.logprob for e in entries])
    return _VllmChoice(
        token_ids=ids,
        prompt_token_ids=prompt_ids,
        logprobs=logprobs,
        finish_reason=choice.finish_reason,
        stop_reason=choice.stop_reason,
        routed_experts=choice.routed_experts,
    )


def completion_reply(url: str, content: bytes, generate: bool) -> VllmCompletionReply:
    """A whole reply body of either endpoint, validated, in the completions shape that
    `extract_completion` checks."""
    if not generate:
        return validate_reply(url, VllmCompletionReply, content)
    reply = validate_reply(url, GenerateReply, content)
    choice = _as_completion_choice(url, reply.choices[0], reply.prompt_token_ids)
    return VllmCompletionReply(choices=[choice], usage=reply.usage)


# --- the lean decode of a whole reply -----------------------------------------------------


def lean_completion(
    url: str, prompt_ids: list[int], content: bytes, generate: bool
) -> tuple[EngineCompletion, str | None] | None:
    """A well-formed whole reply of either endpoint as its completion and encoded routed
    experts, read straight off the parsed JSON: no wire models, no re-validated lists (the
    reply grows with the prompt, which vLLM echoes). Checks what `extract_completion`
    checks, strictly typed; None for anything else, which the wire models then read (and
    name what is wrong)."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if type(body) is not dict:
        return None
    choices = body.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    choice: dict[str, Any] = choices[0]
    ids = choice.get("token_ids")
    if type(ids) is not list or not all(type(t) is int and t >= 0 for t in ids):
        return None
    echoed = body.get("prompt_token_ids") if generate else choice.get("prompt_token_ids")
    if echoed is not None and echoed != prompt_ids:
        return None
    logprobs = _lean_logprobs(choice.get("logprobs"), ids, generate)
    finish, stop = choice.get("finish_reason"), choice.get("stop_reason")
    text = "" if generate else choice.get("text", "")
    routed = choice.get("routed_experts")
    if (
        logprobs is None
        or finish not in ("stop", "length")
        or not (stop is None or type(stop) in (int, str))
        or type(text) is not str
        or not (routed is None or type(routed) is str)
        or type(choice.get("index", 0)) is not int
    ):
        return None
    cached = _lean_cached(body.get("usage"), len(prompt_ids), len(ids))
    if cached is None:
        return None
    completion = EngineCompletion.model_construct(
        url=url,
        output_ids=ids,
        output_logprobs=logprobs,
        text=text,
        finish_reason=finish,
        stop_reason=stop,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(ids),
        cached_prompt_tokens=cached,
        routed_experts=None,
        routing_missing=None,
    )
    return completion, routed


def _lean_logprobs(logprobs: Any, ids: list[int], generate: bool) -> list[float] | None:
    """The sampled tokens' logprobs, one finite float per id; None if anything is off."""
    if type(logprobs) is not dict:
        return None
    if generate:
        entries = logprobs.get("content")
        if type(entries) is not list or len(entries) != len(ids):
            return None
        values = []
        for entry, token in zip(entries, ids, strict=True):
            if type(entry) is not dict or entry.get("token_id") != token:
                return None
            values.append(entry.get("logprob"))
        if not all(type(v) is float and v > NO_LOGPROB for v in values):
            return None
    else:
        values = logprobs.get("token_logprobs")
        tokens = logprobs.get("tokens")
        if type(values) is not list or len(values) != len(ids):
            return None
        if tokens is not None and (
            type(tokens) is not list
            or len(tokens) != len(ids)
            or not all(type(t) is str for t in tokens)
        ):
            return None
        if not all(type(v) is float for v in values):
            return None
    # orjson refuses NaN, Infinity and numbers past a double: every float here is finite.
    return values


def _lean_cached(usage: Any, prompt_tokens: int, completion_tokens: int) -> int | None:
    """Cached prompt tokens from a usage that agrees with the call (0 without usage)."""
    if usage is None:
        return 0
    if (
        type(usage) is not dict
        or usage.get("prompt_tokens") != prompt_tokens
        or usage.get("completion_tokens") != completion_tokens
        or type(usage["prompt_tokens"]) is not int
        or type(usage["completion_tokens"]) is not int
    ):
        return None
    details = usage.get("prompt_tokens_details")
    if details is None:
        return 0
    if type(details) is not dict:
        return None
    cached = details.get("cached_tokens", 0)
    if cached is None:
        return 0
    return cached if type(cached) is int else None


class GenerateStreamMerge(StreamMerge):
    """`StreamMerge` for the generate endpoint's stream (same `data:` framing)."""

    chunk_wire: ClassVar[type[ReplyWire]] = _GenerateStreamChunk

    def _completion_choice(self, chunk: Any) -> _VllmChoice:
        return _as_completion_choice(self.url, chunk.choices[0], chunk.prompt_token_ids)


def stream_merge(url: str, generate: bool) -> StreamMerge:
    """The merge for a stream of either endpoint."""
    return GenerateStreamMerge(url) if generate else StreamMerge(url)
