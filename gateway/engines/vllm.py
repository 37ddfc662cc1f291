"""The vLLM engine: token ids to `/v1/completions`, or to its token-in/token-out
`/inference/v1/generate`.

The Gateway renders prompts itself and sends token IDs, so this client never sees text
prompts. It returns the sampled output IDs and their logprobs exactly as the engine
produced them, validated by `vllm_wire`. The generate endpoint (vLLM started with
`--enable-scale-out`) is the leaner one: vLLM neither detokenizes the sampled tokens nor
names each logprob's token nor echoes the prompt's ids.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import aiohttp
import orjson

from gateway.engines.base import EngineCompletion, EngineModelInfo, TokenSink, sampling_values
from gateway.engines.routed_experts import vllm_routing
from gateway.engines.vllm_weights import VllmWeightLoader
from gateway.engines.vllm_wire import (
    VllmCompletionReply,
    VllmModelList,
    bad_reply,
    completion_reply,
    extract_completion,
    lean_completion,
    stream_merge,
    validate_reply,
)
from gateway.errors import GatewayError
from schemas.sampling import SamplingParams

EngineApi = Literal["completions", "generate"]
"""`completions`: vLLM's OpenAI `/v1/completions` (any vLLM); `generate`:
`/inference/v1/generate` (vLLM >= 0.32 started with `--enable-scale-out`)."""

_PATHS: dict[EngineApi, str] = {
    "completions": "/v1/completions",
    "generate": "/inference/v1/generate",
}

_MISSING = {
    "/inference/v1/generate": "start vLLM >= 0.32 with --enable-scale-out, or run the "
    "Gateway with --engine-api completions",
    "/v1/completions": "the Gateway sends token-id prompts to an OpenAI /v1/completions "
    "endpoint (vLLM's); an engine without one cannot be fronted",
}
"""What offers each sampling endpoint, for the error when an engine lacks it."""

ENGINE_UNAVAILABLE_RETRY_AFTER_S = 5.0
"""Retry-After suggested to agents when no engine connection could be made."""

ENGINE_OVERLOADED_RETRY_AFTER_S = 1.0
"""Retry-After used when the engine says it is busy but does not say for how long."""

_JSON_HEADERS = {"content-type": "application/json"}

LineReader = Callable[[str], tuple[list[int], list[float]] | None]
"""Folds one line of an engine's stream into its reply; the sampled (ids, logprobs) the
line carries, if any."""

KEEPALIVE_S = 2.0
"""Idle engine connections are dropped after this, well below the engines' own idle
timeout (uvicorn's and vLLM's is 5 s), so a call is never sent on a connection the engine
is closing (it would fail and could not be retried safely)."""


async def _lines(url: str, resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The body's lines as they arrive, however long (vLLM's first chunk echoes the whole
    prompt's ids; aiohttp's own `readline` caps a line)."""
    buf = bytearray()
    async for data in resp.content.iter_any():
        buf += data
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            yield _utf8(url, buf[start:end].rstrip(b"\r"))
            start = end + 1
        del buf[:start]
    if buf:
        yield _utf8(url, bytes(buf))


def _utf8(url: str, line: bytes | bytearray) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_reply(url, "a stream line is not UTF-8") from exc


def _engine_message(status: int, body: bytes) -> str:
    """The engine's error message; vLLM has used both `{"error": {...}}` and flat shapes."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return text[:500] or f"HTTP {status}"
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
        if isinstance(parsed.get("message"), str):
            return parsed["message"]
    return text[:500]


def _no_route(body: bytes) -> bool:
    """The server's own "no such route" answer (FastAPI's and Starlette's), not an
    endpoint's 404 such as vLLM's for a model it does not serve."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.strip() in (b"Not Found", b"Method Not Allowed", b"")
    return isinstance(parsed, dict) and parsed.get("detail") in ("Not Found", "Method Not Allowed")


def _retry_after(value: str | None) -> float:
    if value is not None:
        try:
            seconds = float(value)
            if math.isfinite(seconds) and seconds >= 0:
                return seconds
        except ValueError:
            pass
    return ENGINE_OVERLOADED_RETRY_AFTER_S


def _status_error(
    url: str, status: int, body: bytes, retry_after: str | None, path: str = ""
) -> GatewayError:
    """Map an engine HTTP error to what the agent should see; a sampling endpoint the
    engine does not have is named with what offers it."""
    message = _engine_message(status, body)
    if status in (404, 405) and path in _MISSING and _no_route(body):
        return GatewayError("engine_bad_reply", f"engine at {url} has no {path}: {_MISSING[path]}")
    if status == 400:
        return GatewayError("invalid_request", message)
    if status == 413:
        return GatewayError("too_large", message)
    if status in (429, 503):
        return GatewayError(
            "overloaded",
            f"engine is overloaded: {message}",
            status=status,
            retry_after=_retry_after(retry_after),
        )
    return GatewayError("engine_bad_reply", f"engine at {url} answered HTTP {status}: {message}")


class VllmEngine:
    """Talks to vLLM servers serving the same model (an `Engine`); the URL of each call
    says which (`routing` picks it). Only failures where the request cannot have reached
    the engine (connect errors) are retried, and on the same URL, to keep a session on
    the engine whose prefix cache holds its history.
    """

    def __init__(
        self,
        model: str,
        *,
        request_timeout_s: float,
        connect_retries: int,
        connect_timeout_s: float = 5.0,
        retry_backoff_s: float = 0.2,
        logprobs: int = 1,
        api: EngineApi = "completions",
    ) -> None:
        if connect_retries < 0:
            raise ValueError("connect_retries must be >= 0")
        self.model = model
        self.connect_retries = connect_retries
        self.retry_backoff_s = retry_backoff_s
        self.logprobs = logprobs
        self.api = api
        self._path = _PATHS[api]
        self.request_timeout_s = request_timeout_s
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=min(connect_timeout_s, request_timeout_s),
            sock_read=request_timeout_s,
        )
        self._http: aiohttp.ClientSession | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    # --- HTTP -----------------------------------------------------------------------------

    @property
    def returns_routing(self) -> bool:
        """Only the generate endpoint returns routed experts."""
        return self.api == "generate"

    def build_payload(
        self, prompt_ids: list[int], sampling: SamplingParams, routing_from: int | None = None
    ) -> dict[str, Any]:
        """The request body: token-ID prompt, sampled-token logprobs, raw output. For
        `generate` the sampling fields (and `engine_extra`) are vLLM `SamplingParams`, and
        vLLM detokenizes only when stop strings need the text; routing is returned from
        prompt token `routing_from` on (vLLM returns it for every call once started with
        `--enable-return-routed-experts`; this only skips what is already held). It holds
        `prompt_ids` itself, not a copy: the body is encoded at once."""
        params = sampling_values(sampling)
        params["logprobs"] = self.logprobs
        params["skip_special_tokens"] = False
        if self.api == "generate":
            params["detokenize"] = bool(sampling.stop)
            if routing_from is not None:
                params["routed_experts_prompt_start"] = routing_from
            params.update(sampling.engine_extra)
            return {
                "model": self.model,
                "token_ids": prompt_ids,
                "sampling_params": params,
                "output_mode": "tokens",
            }
        payload: dict[str, Any] = {"model": self.model, "prompt": prompt_ids, **params}
        payload["return_token_ids"] = True
        payload.update(sampling.engine_extra)
        return payload

    def _session(self) -> aiohttp.ClientSession:
        """One aiohttp session per event loop, made on first use inside it. aiohttp parses
        HTTP in C: the engine call was the largest CPU item of a loaded gateway process
        with httpx + httpcore (pure-Python h11)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.closed or self._http_loop is not loop:
            self._http_loop = loop
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=self._timeout,
                # vLLM answers uncompressed; not offering gzip keeps any proxy in between
                # from compressing the large token-id replies.
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._http

    async def _send(
        self, method: str, url: str, path: str, body: bytes | None = None
    ) -> aiohttp.ClientResponse:
        """Send with connect-only retries; the response once its headers are in (the caller
        reads and releases it). Transport failures and engine error statuses become
        GatewayError."""
        attempt = 0
        while True:
            try:
                resp = await self._session().request(
                    method,
                    f"{url}{path}",
                    data=body,
                    headers=_JSON_HEADERS if body is not None else None,
                )
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                if attempt < self.connect_retries:
                    await asyncio.sleep(min(self.retry_backoff_s * (2**attempt), 2.0))
                    attempt += 1
                    continue
                raise GatewayError(
                    "engine_unavailable",
                    f"cannot connect to engine at {url} after {attempt + 1} attempt(s): "
                    f"{type(exc).__name__}",
                    retry_after=ENGINE_UNAVAILABLE_RETRY_AFTER_S,
                ) from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise self._transport_error(url, exc) from exc
            if resp.status >= 400:
                reply = await self._read(url, resp)
                raise _status_error(url, resp.status, reply, resp.headers.get("Retry-After"), path)
            return resp

    def _transport_error(self, url: str, exc: BaseException, during: str = "") -> GatewayError:
        """A read timeout is the engine's silence; anything else a connection that broke
        after the request may have been processed (so it is never retried)."""
        if isinstance(exc, TimeoutError):  # aiohttp's socket-read timeout is one too
            if during:
                return GatewayError(
                    "engine_timeout",
                    f"engine at {url} stalled for {self.request_timeout_s}s {during}",
                )
            return GatewayError(
                "engine_timeout", f"engine at {url} did not answer within {self.request_timeout_s}s"
            )
        what = (
            f"stream from engine at {url} broke"
            if during
            else f"connection to engine at {url} failed"
        )
        return GatewayError(
            "engine_unavailable",
            f"{what}: {type(exc).__name__}: {exc}",
            retry_after=ENGINE_UNAVAILABLE_RETRY_AFTER_S,
        )

    async def _read(self, url: str, resp: aiohttp.ClientResponse) -> bytes:
        try:
            return await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._transport_error(url, exc) from exc
        finally:
            resp.release()

    async def complete(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        """Sample a continuation of `prompt_ids` on engine `url`."""
        # orjson and pydantic's own JSON parser: both ends scale with the prompt (vLLM
        # echoes the prompt ids), so the slower stdlib `json` would grow with the session.
        payload = orjson.dumps(self.build_payload(prompt_ids, sampling, routing_from))
        resp = await self._send("POST", url, self._path, payload)
        content = await self._read(url, resp)
        generate = self.api == "generate"
        lean = lean_completion(url, prompt_ids, content, generate)
        if lean is not None:
            completion, routed = lean
            if routing_from is None:
                return completion
            return self._with_routing(completion, routed, len(prompt_ids), routing_from)
        reply = completion_reply(url, content, generate)  # names what is wrong
        return self._completion(url, prompt_ids, reply, routing_from)

    async def stream(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        on_tokens: TokenSink,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        """Sample like `complete`, but on vLLM's stream: `on_tokens(ids, logprobs)` gets each
        chunk's sampled ids as they arrive. The result is validated exactly as `complete`'s
        (the chunks are merged into one reply first), so both paths record the same."""
        payload = self.build_payload(prompt_ids, sampling, routing_from)
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
        merged = stream_merge(url, generate=self.api == "generate")
        await self._read_stream(url, self._path, payload, merged.line, on_tokens)
        return self._completion(url, prompt_ids, merged.reply(), routing_from)

    def _completion(
        self,
        url: str,
        prompt_ids: list[int],
        reply: VllmCompletionReply,
        routing_from: int | None,
    ) -> EngineCompletion:
        """The validated completion, with its routing decoded when the call asked for it."""
        completion = extract_completion(url, prompt_ids, reply)
        if routing_from is None:
            return completion
        encoded = reply.choices[0].routed_experts
        return self._with_routing(completion, encoded, len(prompt_ids), routing_from)

    def _with_routing(
        self, completion: EngineCompletion, encoded: str | None, prompt_len: int, routing_from: int
    ) -> EngineCompletion:
        """The completion with the routed experts the call asked for, or why it has none."""
        if not self.returns_routing:
            routing = None, "the /v1/completions endpoint returns no routed experts"
        else:
            routing = vllm_routing(encoded, prompt_len, len(completion.output_ids), routing_from)
        experts, missing = routing
        return completion.model_copy(update={"routed_experts": experts, "routing_missing": missing})

    async def _read_stream(
        self, url: str, path: str, payload: dict[str, Any], read: LineReader, on_tokens: TokenSink
    ) -> None:
        """Send a streamed call and read its lines to the end; `read` folds each line into
        the reply and returns the sampled tokens it carries, which go to `on_tokens`."""
        resp = await self._send("POST", url, path, orjson.dumps(payload))
        finished = False
        try:
            async for line in _lines(url, resp):
                chunk = read(line)
                if chunk is not None:
                    on_tokens(*chunk)
            finished = True
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._transport_error(url, exc, during="mid-stream") from exc
        finally:
            # Anything but a stream read to its end closes the connection (on cancellation
            # too): vLLM aborts a request whose client left.
            if finished:
                resp.release()
            else:
                resp.close()

    async def model_info(self, url: str) -> EngineModelInfo:
        """Read `/v1/models` for our model's context window (`max_model_len`)."""
        url = url.rstrip("/")
        resp = await self._send("GET", url, "/v1/models")
        listing = validate_reply(url, VllmModelList, await self._read(url, resp))
        for card in listing.data:
            if card.id == self.model:
                if card.max_model_len is None or card.max_model_len <= 0:
                    raise bad_reply(url, f"model {card.id!r} has no max_model_len")
                return EngineModelInfo(id=card.id, max_model_len=card.max_model_len)
        served = [c.id for c in listing.data]
        raise bad_reply(url, f"model {self.model!r} is not served (engine serves {served})")

    def weight_loader(self, url: str) -> VllmWeightLoader:
        """In-place reload through vLLM's dev endpoints (`vllm_weights`)."""
        return VllmWeightLoader(url)

    async def aclose(self) -> None:
        if self._http is not None and not self._http.closed:
            await self._http.close()
