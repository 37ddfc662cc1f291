"""The engines `rollout gateway --engine-api NAME` can front, by name, and what each
name builds: a new engine is one module in this package and its entry here."""

from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from gateway.engines.base import Engine

EngineName = Literal["completions", "generate", "sglang"]
"""`completions`: vLLM's OpenAI `/v1/completions` (any vLLM); `generate`: vLLM's
token-in/token-out `/inference/v1/generate` (>= 0.32 with `--enable-scale-out`);
`sglang`: SGLang's native `/generate` (a trainer's own SGLang engines)."""


RoutingShape = tuple[int, int]
"""(MoE layers, experts per token and layer) of the served model."""


class EngineFactory(Protocol):
    """Builds the client of engines serving `model`."""

    def __call__(
        self,
        model: str,
        *,
        request_timeout_s: float,
        connect_retries: int,
        routing_shape: RoutingShape | None = None,
    ) -> "Engine": ...


def _vllm(api: Literal["completions", "generate"]) -> EngineFactory:
    def build(
        model: str,
        *,
        request_timeout_s: float,
        connect_retries: int,
        routing_shape: RoutingShape | None = None,
    ) -> "Engine":
        from gateway.engines.vllm import VllmEngine

        return VllmEngine(
            model, api=api, request_timeout_s=request_timeout_s, connect_retries=connect_retries
        )

    return build


def _sglang(
    model: str,
    *,
    request_timeout_s: float,
    connect_retries: int,
    routing_shape: RoutingShape | None = None,
) -> "Engine":
    from gateway.engines.sglang import SglangEngine

    return SglangEngine(
        model,
        routing_shape=routing_shape,
        request_timeout_s=request_timeout_s,
        connect_retries=connect_retries,
    )


def routing_unavailable(api: EngineName, shape: RoutingShape | None) -> str | None:
    """Why the engines behind `api` cannot return routed experts (None: they can)."""
    if api == "completions":
        return (
            "vLLM's /v1/completions returns no routed experts: use --engine-api generate "
            "(vLLM >= 0.32 started with --enable-scale-out --enable-return-routed-experts)"
        )
    if api == "sglang" and shape is None:
        return (
            "SGLang returns routed experts without their shape: give "
            "--routed-experts-layers and --routed-experts-top-k"
        )
    return None


ENGINES: dict[EngineName, EngineFactory] = {
    "completions": _vllm("completions"),
    "generate": _vllm("generate"),
    "sglang": _sglang,
}
"""Each client is imported when it is built: the CLI reads `EngineName` for its options
and must not pay for every engine's HTTP stack at start-up."""
