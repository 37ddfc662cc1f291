"""The engines `rollout gateway --engine-api NAME` can front, by name, and what each
name builds: a new engine is one module in this package and its entry here."""

from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from gateway.engines.base import Engine

EngineName = Literal["completions", "generate", "sglang"]
"""`completions`: vLLM's OpenAI `/v1/completions` (any vLLM); `generate`: vLLM's
token-in/token-out `/inference/v1/generate` (>= 0.32 with `--enable-scale-out`);
`sglang`: SGLang's native `/generate` (a trainer's own SGLang engines)."""


class EngineFactory(Protocol):
    """Builds the client of engines serving `model`."""

    def __call__(
        self, model: str, *, request_timeout_s: float, connect_retries: int
    ) -> "Engine": ...


def _vllm(api: Literal["completions", "generate"]) -> EngineFactory:
    def build(model: str, *, request_timeout_s: float, connect_retries: int) -> "Engine":
        from gateway.engines.vllm import VllmEngine

        return VllmEngine(
            model, api=api, request_timeout_s=request_timeout_s, connect_retries=connect_retries
        )

    return build


def _sglang(model: str, *, request_timeout_s: float, connect_retries: int) -> "Engine":
    from gateway.engines.sglang import SglangEngine

    return SglangEngine(model, request_timeout_s=request_timeout_s, connect_retries=connect_retries)


ENGINES: dict[EngineName, EngineFactory] = {
    "completions": _vllm("completions"),
    "generate": _vllm("generate"),
    "sglang": _sglang,
}
"""Each client is imported when it is built: the CLI reads `EngineName` for its options
and must not pay for every engine's HTTP stack at start-up."""
