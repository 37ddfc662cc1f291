"""The SGLang engine: token ids to SGLang's native `/generate`, for engines a trainer owns
(slime's, verl's SGLang rollout servers) put behind the Gateway.

What SGLang offers (read from slime, which drives it the same way, and SGLang's own
request and server models): `POST /generate` takes `input_ids` and `sampling_params`
(`max_new_tokens`, `sampling_seed`, `stop`, `stop_token_ids`, `no_stop_trim`, …); with
`return_logprob` the reply's `meta_info.output_token_logprobs` is one `[logprob, token_id,
text|null]` per sampled token, `meta_info.finish_reason` is `{"type": "stop"|"length"|
"abort", "matched": …}` and `meta_info` also counts `prompt_tokens`, `completion_tokens`,
`cached_tokens` and names the `weight_version` serving it. Streamed, each `data:` line
repeats the output so far, or only the new part when the server runs with
`--incremental-streaming-output` (`incremental_stream=True` here). `/get_server_info`
holds the server's arguments (`context_length`, `served_model_name`), `/get_weight_version`
the version, and `/update_weights_from_disk` reloads a checkpoint in place.

A reply is mapped onto the vLLM completion shape and validated by the same
`vllm_wire.extract_completion`, so both engines' samples pass the same checks. An
`abort` (a trainer paused the engine to sync weights: SGLang's default pause aborts what
runs) is not a completion: it is `engine_unavailable`, retryable once the engine resumes.
HTTP, retries and error mapping are `VllmEngine`'s.

Tested against `FakeSglangForTests` only: SGLang does not run on this CPU box.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
from pydantic import ValidationError

from gateway.engines.base import (
    EngineCompletion,
    EngineModelInfo,
    TokenSink,
    WeightLoadError,
    sampling_values,
)
from gateway.engines.routed_experts import sglang_routing
from gateway.engines.vllm import (
    ENGINE_UNAVAILABLE_RETRY_AFTER_S,
    VllmEngine,
)
from gateway.engines.vllm_wire import (
    VllmCompletionReply,
    _VllmChoice,
    _VllmLogprobs,
    _VllmPromptTokensDetails,
    _VllmUsage,
    bad_reply,
    extract_completion,
    validate_reply,
)
from gateway.errors import GatewayError
from gateway.protocols.wire import ReplyWire, validation_summary
from schemas.policy import WeightUpdate, WeightUpdateReport
from schemas.sampling import SamplingParams

_RENAMED = {"max_tokens": "max_new_tokens", "seed": "sampling_seed"}


class _SglangFinish(ReplyWire):
    type: str
    matched: int | str | None = None


class _SglangMeta(ReplyWire):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    output_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    finish_reason: _SglangFinish | None = None
    weight_version: str | None = None
    routed_experts: str | None = None


class SglangReply(ReplyWire):
    text: str = ""
    meta_info: _SglangMeta


class _SglangServerInfo(ReplyWire):
    context_length: int | None = None
    served_model_name: str | None = None
    model_path: str | None = None


def as_completion(url: str, reply: SglangReply) -> VllmCompletionReply:
    """A final SGLang reply in the completions shape `extract_completion` checks."""
    meta = reply.meta_info
    finish = meta.finish_reason
    if finish is None:
        raise bad_reply(url, "meta_info.finish_reason missing in a final reply")
    if finish.type == "abort":
        raise GatewayError(
            "engine_unavailable",
            f"engine at {url} aborted the call (paused for a weight sync?); retry",
            retry_after=ENGINE_UNAVAILABLE_RETRY_AFTER_S,
        )
    if meta.output_token_logprobs is None:
        raise bad_reply(url, "meta_info.output_token_logprobs missing (return_logprob)")
    entries = meta.output_token_logprobs
    return VllmCompletionReply(
        choices=[
            _VllmChoice(
                text=reply.text,
                token_ids=[token for _, token, _ in entries],
                logprobs=_VllmLogprobs(token_logprobs=[lp for lp, _, _ in entries]),
                finish_reason=finish.type,
                stop_reason=finish.matched if finish.type == "stop" else None,
            )
        ],
        usage=_VllmUsage(
            prompt_tokens=meta.prompt_tokens,
            completion_tokens=meta.completion_tokens,
            prompt_tokens_details=_VllmPromptTokensDetails(cached_tokens=meta.cached_tokens),
        ),
    )


class SglangStreamMerge:
    """Folds SGLang's `/generate` stream into its final reply; yields each line's new
    tokens, if any. Cumulative lines (SGLang's default) must extend what came before."""

    def __init__(self, url: str, incremental: bool) -> None:
        self.url = url
        self.incremental = incremental
        self.entries: list[tuple[float | None, int, str | None]] = []
        self.text = ""
        self.last: SglangReply | None = None
        self.done = False

    def line(self, line: str) -> tuple[list[int], list[float]] | None:
        if not line.startswith("data:"):
            return None
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return None
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise bad_reply(self.url, "a stream chunk is not JSON") from exc
        if isinstance(body, dict) and "error" in body:
            error = body["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise bad_reply(self.url, f"error mid-stream: {message}")
        try:
            chunk = SglangReply.model_validate_json(data)  # strict: JSON arrays are tuples
        except ValidationError as exc:
            raise bad_reply(self.url, validation_summary(exc)) from exc
        new = chunk.meta_info.output_token_logprobs or []
        if not self.incremental:
            seen = len(self.entries)
            if len(new) < seen or (seen and new[seen - 1][1] != self.entries[-1][1]):
                raise bad_reply(self.url, "a cumulative stream chunk does not extend the last")
            new = new[seen:]
        if any(lp is None for lp, _, _ in new):
            raise bad_reply(self.url, "a stream chunk has a sampled token without a logprob")
        self.entries.extend(new)
        self.text = self.text + chunk.text if self.incremental else chunk.text
        self.last = chunk
        if not new:
            return None
        return [t for _, t, _ in new], [float(lp) for lp, _, _ in new if lp is not None]

    def reply(self) -> SglangReply:
        if not self.done or self.last is None:
            raise bad_reply(self.url, "the stream ended without [DONE]")
        meta = self.last.meta_info.model_copy(update={"output_token_logprobs": self.entries})
        return SglangReply(text=self.text, meta_info=meta)


class SglangEngine(VllmEngine):
    """Talks to SGLang servers serving the same model (an `Engine`), through their native
    `/generate`; `incremental_stream` must match the servers'
    `--incremental-streaming-output`; `routing_shape` (MoE layers, top_k) is the served
    model's, which SGLang's routed experts come without."""

    def __init__(
        self,
        model: str,
        *,
        incremental_stream: bool = False,
        routing_shape: tuple[int, int] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model, **options)
        self.incremental_stream = incremental_stream
        self.routing_shape = routing_shape

    @property
    def returns_routing(self) -> bool:
        return self.routing_shape is not None

    def build_payload(
        self, prompt_ids: list[int], sampling: SamplingParams, routing_from: int | None = None
    ) -> dict[str, Any]:
        """Token-id prompt, sampled-token logprobs, stop tokens kept in the output; routed
        experts when asked (SGLang returns the whole sequence's)."""
        params = sampling_values(sampling, _RENAMED)
        params["skip_special_tokens"] = False
        params["spaces_between_special_tokens"] = False
        params["no_stop_trim"] = True
        params.update(sampling.engine_extra)
        payload = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True}
        if routing_from is not None:
            payload["return_routed_experts"] = True
        return payload

    async def complete(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        payload = orjson.dumps(self.build_payload(prompt_ids, sampling, routing_from))
        resp = await self._send("POST", url, "/generate", payload)
        reply = validate_reply(url, SglangReply, await self._read(url, resp))
        return self._routed(url, prompt_ids, reply, routing_from)

    async def stream(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        on_tokens: TokenSink,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        payload = self.build_payload(prompt_ids, sampling, routing_from)
        payload["stream"] = True
        merged = SglangStreamMerge(url, self.incremental_stream)
        await self._read_stream(url, "/generate", payload, merged.line, on_tokens)
        return self._routed(url, prompt_ids, merged.reply(), routing_from)

    def _routed(
        self, url: str, prompt_ids: list[int], reply: SglangReply, routing_from: int | None
    ) -> EngineCompletion:
        """The validated completion, with its routing decoded when the call asked for it."""
        completion = extract_completion(url, prompt_ids, as_completion(url, reply))
        if routing_from is None:
            return completion
        if self.routing_shape is None:
            routing = None, "SGLang's routed experts need the model's shape (not given)"
        else:
            routing = sglang_routing(
                reply.meta_info.routed_experts,
                len(prompt_ids),
                len(completion.output_ids),
                routing_from,
                self.routing_shape,
            )
        experts, missing = routing
        return completion.model_copy(update={"routed_experts": experts, "routing_missing": missing})

    async def model_info(self, url: str) -> EngineModelInfo:
        """The context window and served name from `/get_server_info` (the server's
        arguments): start SGLang with `--context-length` so it is stated."""
        url = url.rstrip("/")
        resp = await self._send("GET", url, "/get_server_info")
        info = validate_reply(url, _SglangServerInfo, await self._read(url, resp))
        served = info.served_model_name or info.model_path
        if served is not None and served != self.model:
            raise bad_reply(url, f"model {self.model!r} is not served (engine serves {served!r})")
        if info.context_length is None or info.context_length <= 0:
            raise bad_reply(
                url, "server info has no context_length (start it with --context-length)"
            )
        return EngineModelInfo(id=self.model, max_model_len=info.context_length)

    def weight_loader(self, url: str) -> SglangWeightLoader:
        return SglangWeightLoader(url)


class SglangWeightLoader:
    """Reloads a checkpoint in place through `/update_weights_from_disk`, after the
    Gateway's own pause and drain (so nothing runs on the engine), naming the version so
    the engine reports it."""

    def __init__(self, url: str, timeout_s: float = 3600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    async def current_version(self) -> str | None:
        async with httpx.AsyncClient(timeout=30.0) as client:
            reply = await client.get(f"{self.url}/get_weight_version")
        if reply.status_code != 200:
            return None
        version = reply.json().get("weight_version")
        return version if isinstance(version, str) else None

    async def load(self, update: WeightUpdate) -> WeightUpdateReport:
        start = time.monotonic()
        body = {"model_path": update.checkpoint, "weight_version": update.policy_version}
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                reply = await client.post(f"{self.url}/update_weights_from_disk", json=body)
        except httpx.HTTPError as exc:
            raise WeightLoadError(f"{self.url}: weight load failed: {exc}", touched=True) from exc
        try:
            result = reply.json()
        except ValueError:
            result = {}
        if reply.status_code != 200 or result.get("success") is False:
            message = result.get("message") or reply.text[:500]
            raise WeightLoadError(f"{self.url}: weight load failed: {message}", touched=True)
        took = time.monotonic() - start
        return WeightUpdateReport(
            engine=self.url,
            policy_version=update.policy_version,
            method="reload",
            pause_s=0.0,
            load_s=took,
            total_s=took,
        )
