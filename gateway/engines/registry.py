"""The engines `rollout gateway --engine-api NAME` can front, by name, and what each
name builds: a new engine is one module in this package and its entry here."""

from functools import partial
from typing import Literal, Protocol

from gateway.engines.base import Engine
from gateway.engines.sglang import SglangEngine
from gateway.engines.vllm import VllmEngine

EngineName = Literal["completions", "generate", "sglang"]
"""`completions`: vLLM's OpenAI `/v1/completions` (any vLLM); `generate`: vLLM's
token-in/token-out `/inference/v1/generate` (>= 0.32 with `--enable-scale-out`);
`sglang`: SGLang's native `/generate` (a trainer's own SGLang engines)."""


class EngineFactory(Protocol):
    """Builds the client of engines serving `model`."""

    def __call__(self, model: str, *, request_timeout_s: float, connect_retries: int) -> Engine: ...


ENGINES: dict[EngineName, EngineFactory] = {
    "completions": partial(VllmEngine, api="completions"),
    "generate": partial(VllmEngine, api="generate"),
    "sglang": SglangEngine,
}
