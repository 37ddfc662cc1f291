"""STAND-IN MoE engine: vLLM's token-in/token-out ``/inference/v1/generate`` served by a
tiny random Qwen3-MoE model in transformers, with ``routed_experts`` in vLLM's encoding.

Runs in the vLLM CPU venv (torch, transformers, xgrammar and vLLM itself), started by
``devstack.reference_moe.server``: ``python engine_server.py MODEL_DIR --port N``. It
imports nothing of this project. Request and reply bodies are vLLM's own protocol models
(``GenerateRequest``, ``GenerateTokensResponse`` and the stream chunks), so the wire shape
is vLLM 0.32's by construction. What it does as vLLM does:

* ``routed_experts``: base64 of the ``.npy`` of a ``(forwarded tokens, layers, top_k)``
  array, uint8 up to 256 experts (uint16 above), the experts each forward pass actually
  used (read from the routers while the model runs). The forwarded tokens are the prompt
  and every sampled token but the last (it was never fed back), minus the first
  ``sampling_params.routed_experts_prompt_start`` prompt tokens. In a stream it rides on
  the final chunk only.
* logprobs: vLLM's default ``raw_logprobs`` (the model's distribution before logit
  processors, temperature and top-k/p, but after the structured-output mask), with the
  sampled token first in ``top_logprobs`` and vLLM's ranks.
* sampling: ``temperature`` (0 is greedy), ``top_k``, ``top_p``, ``seed``, ``max_tokens``,
  ``min_tokens``, ``logit_bias``, ``allowed_token_ids``, ``stop_token_ids``,
  ``ignore_eos`` and ``structured_outputs.regex`` (xgrammar, the library vLLM uses).

Steering: a random model does not write tool calls by itself. Clients steer it the way
the project steers real vLLM CPU: a ``structured_outputs.regex`` (a session's
``engine_extra``) and ``logit_bias``. Every token is still sampled from the model's own
logits under that mask and bias, so its routing is the model's real routing. Any other
sampling field that changes the distribution is refused with a 400 naming it.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import uvicorn
import xgrammar
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateLogProb,
    GenerateLogProbs,
    GenerateLogProbsContent,
    GenerateRequest,
    GenerateTokensChoice,
    GenerateTokensResponse,
    GenerateTokensStreamChoice,
    GenerateTokensStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse, UsageInfo
from vllm.sampling_params import SamplingParams
from vllm.utils.serial_utils import numpy2base64

UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "stop": [],
    "bad_words": [],
    "prompt_logprobs": None,
    "trace_decode_token_ids": None,
}
"""Fields this stand-in does not implement, with the value that means "off"."""


class BadRequest(ValueError):
    """A request the stand-in refuses (HTTP 400, vLLM's error body)."""


@dataclass
class Generation:
    """One request's result: sampled ids, their logprob maps, routing of forwarded tokens."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, tuple[float, int]]] = field(default_factory=list)
    routing: list[np.ndarray] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | None = None


class MoeSampler:
    """The model, its routers' hooks and the sampling loop (one request at a time)."""

    def __init__(self, model_dir: Path, max_model_len: int) -> None:
        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        config = self.model.config
        self.num_experts = int(config.num_experts)
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = max_model_len
        generation = json.loads((model_dir / "generation_config.json").read_text())
        eos = generation["eos_token_id"]
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=sorted(self.eos_ids)
        )
        self.grammars = xgrammar.GrammarCompiler(info)
        self.lock = threading.Lock()
        self._step: list[torch.Tensor] = []
        for layer in self.model.model.layers:
            layer.mlp.gate.register_forward_hook(self._capture)

    def _capture(self, _module: Any, _inputs: Any, output: Any) -> None:
        """The router's chosen experts (its third output), which the experts then run."""
        self._step.append(output[2].detach().clone())

    def _forward(self, ids: list[int], cache: Any) -> tuple[torch.Tensor, Any, np.ndarray]:
        self._step = []
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        routing = torch.stack(self._step, dim=1).numpy()  # (tokens, layers, top_k)
        return out.logits[0, -1].float(), out.past_key_values, routing

    def check(self, request: GenerateRequest) -> SamplingParams:
        params = request.sampling_params
        for name, off in UNSUPPORTED_DEFAULTS.items():
            if getattr(params, name) not in (off, None):
                raise BadRequest(
                    f"the stand-in MoE engine does not implement sampling_params.{name}"
                )
        guide = params.structured_outputs
        if guide is not None and any(
            getattr(guide, k) is not None for k in ("json", "choice", "grammar", "structural_tag")
        ):
            raise BadRequest("the stand-in MoE engine takes only structured_outputs.regex")
        prompt_len = len(request.token_ids)
        if not 0 <= params.routed_experts_prompt_start <= prompt_len:
            raise BadRequest(
                "routed_experts_prompt_start must be between 0 and the prompt length "
                f"({prompt_len}), inclusive."
            )
        if max(request.token_ids) >= self.vocab_size:
            raise BadRequest(f"token id {max(request.token_ids)} is out of vocabulary")
        if prompt_len >= self.max_model_len:
            raise BadRequest(f"prompt of {prompt_len} tokens exceeds max_model_len")
        return params

    def generate(self, request: GenerateRequest) -> Iterator[tuple[Generation, int]]:
        """Yields (state, index of the newly sampled token) after each sampled token."""
        params = self.check(request)
        max_tokens = min(
            params.max_tokens or self.max_model_len, self.max_model_len - len(request.token_ids)
        )
        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
        matcher = None
        if params.structured_outputs is not None and params.structured_outputs.regex:
            try:
                grammar = self.grammars.compile_regex(params.structured_outputs.regex)
            except Exception as exc:  # xgrammar raises RuntimeError subclasses
                raise BadRequest(f"structured_outputs.regex does not compile: {exc}") from exc
            matcher = xgrammar.GrammarMatcher(grammar)
        state = Generation()
        with self.lock:
            cache = None
            feed = list(request.token_ids)
            while state.finish_reason is None:
                logits, cache, routing = self._forward(feed, cache)
                state.routing.append(routing)
                if matcher is not None:
                    mask = xgrammar.allocate_token_bitmask(1, self.vocab_size)
                    matcher.fill_next_token_bitmask(mask)
                    logits = logits.unsqueeze(0)
                    xgrammar.apply_token_bitmask_inplace(logits, mask)
                    logits = logits[0]
                logprobs = torch.log_softmax(logits, dim=-1)
                token = self._sample(logits, params, len(state.token_ids), generator)
                state.token_ids.append(token)
                state.logprobs.append(_logprob_map(logprobs, token, params.logprobs))
                if matcher is not None and not matcher.accept_token(token):
                    raise BadRequest(f"token {token} breaks structured_outputs.regex")
                state.finish_reason, state.stop_reason = self._finish(
                    token, params, max_tokens, state
                )
                feed = [token]
                yield state, len(state.token_ids) - 1

    def _sample(
        self, logits: torch.Tensor, params: SamplingParams, produced: int, gen: torch.Generator
    ) -> int:
        """vLLM's logit processors (allowed ids, bias, min tokens), then temperature, top-k/p."""
        logits = logits.clone()
        if params.allowed_token_ids:
            keep = torch.full_like(logits, float("-inf"))
            keep[params.allowed_token_ids] = 0.0
            logits += keep
        for token, bias in (params.logit_bias or {}).items():
            logits[int(token)] += float(bias)
        if produced < params.min_tokens:
            for token in self.eos_ids | set(params.stop_token_ids or []):
                logits[token] = float("-inf")
        if params.temperature < 1e-5:
            return int(torch.argmax(logits))
        logits = logits / params.temperature
        if params.top_k and 0 < params.top_k < logits.numel():
            kth = torch.topk(logits, params.top_k).values[-1]
            logits[logits < kth] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        if params.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            beyond = torch.cumsum(ordered, dim=-1) - ordered > params.top_p
            probs[order[beyond]] = 0.0
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=gen))

    def _finish(
        self, token: int, params: SamplingParams, max_tokens: int, state: Generation
    ) -> tuple[str | None, int | None]:
        if token in (params.stop_token_ids or []):
            return "stop", token
        if token in self.eos_ids and not params.ignore_eos:
            return "stop", None
        if len(state.token_ids) >= max_tokens:
            return "length", None
        return None, None

    def routed_experts(self, request: GenerateRequest, state: Generation) -> str:
        """vLLM's encoding: the forwarded tokens' rows from `routed_experts_prompt_start`."""
        rows = np.concatenate(state.routing, axis=0)
        dtype = np.uint8 if self.num_experts <= 256 else np.uint16
        start = request.sampling_params.routed_experts_prompt_start
        return numpy2base64(np.ascontiguousarray(rows[start:].astype(dtype)))


def _logprob_map(
    logprobs: torch.Tensor, token: int, wanted: int | None
) -> dict[int, tuple[float, int]]:
    """vLLM's per-position map: the sampled token first, then the top `wanted` by rank."""
    if wanted is None:
        return {}
    sampled = float(logprobs[token])
    entries = {token: (sampled, int((logprobs > logprobs[token]).sum()) + 1)}
    if wanted > 0:
        top = torch.topk(logprobs, wanted)
        for rank, (value, index) in enumerate(zip(top.values, top.indices, strict=True), 1):
            entries.setdefault(int(index), (float(value), rank))
    return entries


def _clamp(logprob: float) -> float:
    return -9999.0 if logprob != logprob else max(logprob, -9999.0)


def _choice_logprobs(state: Generation, start: int, wanted: int | None) -> GenerateLogProbs | None:
    """`GenerateLogProbs` as vLLM's `_create_tokens_logprobs` shapes them."""
    if wanted is None:
        return None
    content = []
    for token, entries in zip(state.token_ids[start:], state.logprobs[start:], strict=True):
        value, rank = entries[token]
        content.append(
            GenerateLogProbsContent(
                token_id=token,
                logprob=_clamp(value),
                rank=rank or None,
                top_logprobs=[
                    GenerateLogProb(token_id=t, logprob=_clamp(lp), rank=r or None)
                    for i, (t, (lp, r)) in enumerate(entries.items())
                    if wanted == -1 or i < max(wanted, 1)
                ],
            )
        )
    return GenerateLogProbs(content=content)


def _error(message: str) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type="BadRequestError", code=400))
    return JSONResponse(body.model_dump(), status_code=400)


def make_app(sampler: MoeSampler, served_model_name: str) -> FastAPI:
    app = FastAPI(title="STAND-IN reference MoE engine")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        card = {"id": served_model_name, "object": "model", "max_model_len": sampler.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/inference/v1/generate")
    async def generate(raw: Request) -> Any:
        try:
            request = GenerateRequest.model_validate_json(await raw.body())
            sampler.check(request)
        except (ValidationError, BadRequest) as exc:
            return _error(str(exc))
        if request.output_mode != "tokens":
            return _error("the stand-in MoE engine answers output_mode 'tokens' only")
        if request.stream:
            return StreamingResponse(_stream(sampler, request), media_type="text/event-stream")
        return await run_in_threadpool(_whole, sampler, request, served_model_name)

    return app


def _usage(request: GenerateRequest, state: Generation) -> UsageInfo:
    prompt, completion = len(request.token_ids), len(state.token_ids)
    return UsageInfo(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def _whole(sampler: MoeSampler, request: GenerateRequest, model: str) -> Any:
    try:
        *_, (state, _) = sampler.generate(request)
    except BadRequest as exc:
        return _error(str(exc))
    choice = GenerateTokensChoice(
        index=0,
        finish_reason=state.finish_reason,
        stop_reason=state.stop_reason,
        token_ids=state.token_ids,
        logprobs=_choice_logprobs(state, 0, request.sampling_params.logprobs),
        routed_experts=sampler.routed_experts(request, state),
    )
    reply = GenerateTokensResponse(
        request_id=request.request_id,
        model=model,
        usage=_usage(request, state),
        prompt_token_ids=request.token_ids if request.return_token_ids else None,
        choices=[choice],
    )
    return JSONResponse(json.loads(reply.model_dump_json()))


def _stream(sampler: MoeSampler, request: GenerateRequest) -> Iterator[str]:
    """One chunk per sampled token; the last carries finish reason and routing."""
    wanted = request.sampling_params.logprobs
    first = True
    state = Generation()
    try:
        for state, index in sampler.generate(request):
            done = state.finish_reason is not None
            chunk = GenerateTokensStreamResponse(
                request_id=request.request_id,
                choices=[
                    GenerateTokensStreamChoice(
                        index=0,
                        finish_reason=state.finish_reason,
                        stop_reason=state.stop_reason,
                        token_ids=[state.token_ids[index]],
                        logprobs=_choice_logprobs(state, index, wanted),
                        routed_experts=sampler.routed_experts(request, state) if done else None,
                    )
                ],
            )
            exclude = {"mm_placeholders", "metrics"}
            if first and request.return_token_ids:
                chunk.prompt_token_ids = request.token_ids
            else:
                exclude.add("prompt_token_ids")
            first = False
            yield f"data: {chunk.model_dump_json(exclude=exclude)}\n\n"
    except BadRequest as exc:
        error = ErrorResponse(error=ErrorInfo(message=str(exc), type="BadRequestError", code=400))
        yield f"data: {error.model_dump_json()}\n\n"
    options = request.stream_options
    if options is not None and options.include_usage:
        final = GenerateTokensStreamResponse(
            request_id=request.request_id, choices=[], usage=_usage(request, state)
        )
        yield f"data: {final.model_dump_json(exclude_none=True)}\n\n"
    yield "data: [DONE]\n\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="STAND-IN MoE engine (vLLM generate wire)")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="tiny-qwen3-moe")
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args()
    sampler = MoeSampler(args.model_dir, args.max_model_len)
    app = make_app(sampler, args.served_model_name)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
