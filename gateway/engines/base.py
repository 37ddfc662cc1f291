"""What the Gateway needs of an engine, whatever serves the model: the `Engine` protocol
(sample a continuation of token ids, whole or streamed; describe the served model; load
new weights) and the engine-independent shapes it returns.

The Gateway renders prompts itself and sends token ids, so an engine never sees text
prompts; it returns the sampled ids and their logprobs exactly as sampled. The
implementations are vLLM's (`vllm`, `vllm_wire`, `vllm_weights`) and SGLang's (`sglang`,
on vLLM's HTTP handling); routing sessions across engines and counting per engine are
`routing` and `stats`, apart from any engine.

Light on purpose (pydantic and schemas only): the trainer imports `vllm_weights`, which
imports this module, in its own environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from schemas.policy import WeightUpdate, WeightUpdateReport
from schemas.routing import RoutedExperts
from schemas.sampling import SamplingParams

TokenSink = Callable[[list[int], list[float]], None]
"""Receives each stream chunk's sampled ids and their logprobs, in order."""

SAMPLING_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
"""The `SamplingParams` fields every engine takes as plain values (some under another
name); `logit_bias` and `engine_extra` are passed apart."""


def sampling_values(sampling: SamplingParams, renamed: Mapping[str, str] = {}) -> dict[str, Any]:
    """The sampling fields a call sets, under the engine's names (`renamed`), and its
    `logit_bias` with string keys (JSON object keys; the engines read them as token ids)."""
    params: dict[str, Any] = {}
    for name in SAMPLING_FIELDS:
        value = getattr(sampling, name)
        if value is not None:
            params[renamed.get(name, name)] = value
    if sampling.logit_bias:
        params["logit_bias"] = {str(t): b for t, b in sampling.logit_bias.items()}
    return params


class EngineCompletion(BaseModel):
    """One validated engine completion: `output_ids[i]` was sampled with `output_logprobs[i]`.

    `text` is the engine's own detokenization (special tokens kept; empty from the generate
    endpoint); informational only — the Gateway decodes `output_ids` itself. `stop_reason`
    is vLLM's: the stop token ID or stop string that ended generation, or None for EOS /
    length. `routed_experts`, of a call that asked for them (`routing_from`), or why it
    has none (`routing_missing`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    output_ids: list[int]
    output_logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]
    stop_reason: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    routed_experts: RoutedExperts | None = None
    routing_missing: str | None = None


class EngineModelInfo(BaseModel):
    """What `/v1/models` says about the served model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    max_model_len: int


class WeightLoadError(RuntimeError):
    """The engine did not load the checkpoint. `touched`: it failed after the engine had
    begun to change its weights, so what it serves is not known; otherwise it keeps
    serving its previous weights."""

    def __init__(self, message: str, *, touched: bool = False) -> None:
        super().__init__(message)
        self.touched = touched


class WeightLoader(Protocol):
    """One engine that can switch its weights to a new checkpoint."""

    async def current_version(self) -> str | None: ...

    async def load(self, update: WeightUpdate) -> WeightUpdateReport: ...


class Engine(Protocol):
    """Engines serving one model, addressed by URL (a session's engine, `routing`)."""

    returns_routing: bool
    """Whether its sampling endpoint can return routed experts (`routing_from`)."""

    async def complete(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        """Sample a continuation of `prompt_ids` on engine `url`; with `routing_from`, also
        the routed experts of the prompt from that token on and of the output."""
        ...

    async def stream(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        on_tokens: TokenSink,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        """Sample like `complete`; `on_tokens` gets each chunk's ids as they arrive. The
        result is validated exactly as `complete`'s, so both paths record the same."""
        ...

    async def model_info(self, url: str) -> EngineModelInfo:
        """The served model's id and context window."""
        ...

    def weight_loader(self, url: str) -> WeightLoader:
        """What loads new weights into engine `url` (a policy update)."""
        ...

    async def aclose(self) -> None: ...
