"""`GatewaySettings`: everything `rollout gateway` accepts, declared once: the command's
options are generated from these fields (`workers.model_options`), with their help,
defaults, types and bounds. Kept apart from the server (`workers.gateway_server`) so the
command line is built without loading it."""

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field, field_validator, model_validator

from gateway.engines.registry import EngineName, RoutingShape, routing_unavailable
from gateway.engines.routing import EngineRouting
from gateway.options import NOT_AN_OPTION, CoreSettings, OptionSpec


def comma_list(value: object) -> object:
    """'a, b,' → ['a', 'b']: one option naming several engines."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class GatewaySettings(CoreSettings):
    """Everything `rollout gateway` accepts, validated before anything starts: the
    process's own fields here, the core's in `CoreSettings`."""

    engine_urls: Annotated[
        list[str], BeforeValidator(comma_list), OptionSpec(name="--engine", type=str)
    ] = Field(min_length=1, description="engine base URL(s), comma-separated")
    model: str = Field(description="model name served by the engine")
    tokenizer: Path = Field(description="model dir with tokenizer.json")
    host: str = Field(default="127.0.0.1", description="agent API listener address")
    """The agent API listener (session tokens): what sandboxes reach."""
    port: int = Field(
        default=8700,
        ge=0,
        le=65535,
        description="agent API port: what sandboxes reach (process i: port+i)",
    )
    control_host: str = Field(
        default="127.0.0.1", description="control API + /metrics listener address"
    )
    """The control API + /metrics + /health listener (admin token): workers, trainers."""
    control_port: int = Field(
        default=8800,
        ge=0,
        le=65535,
        description="control API port: workers, trainers (process i: port+i)",
    )
    shared_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="one agent port for all processes; calls reach their session's owner",
    )
    """One agent address for all processes (SO_REUSEPORT on `host`): session base URLs
    name it, and a call that lands on a process not owning its session is relayed to
    the owner's own port (gateway/http/owner_forwarding.py). None: each process's own port."""
    processes: int = Field(
        default=1, ge=1, description="gateway processes, one agent + one control port each"
    )
    admin_token: Annotated[str | None, OptionSpec(envvar="ROLLOUT_ADMIN_TOKEN")] = Field(
        default=None, description="bearer for the control API"
    )
    insecure_dev: bool = Field(
        default=False, description="no admin token; the control listener must be on loopback"
    )
    chat_template: Path | None = Field(default=None, description="override the chat template")
    family: str | None = Field(
        default=None,
        description="model family (a chat template name); default: detected from the template",
    )
    """The model family whose output format to parse; None: detected from the template,
    or named by vLLM's parser names below."""
    tool_call_parser: str | None = Field(
        default=None, description="vLLM tool-call parser name (hermes, qwen3_coder, glm47…)"
    )
    reasoning_parser: str | None = Field(
        default=None, description="vLLM reasoning parser name (qwen3, deepseek_r1…)"
    )
    public_url: str | None = Field(default=None, description="URL agents reach us at")
    context_window: int | None = Field(default=None, description="override max context")
    max_body_bytes: int = Field(
        default=32 * 2**20, ge=1, description="any request body: 413 past it, before it is read"
    )
    """The ceiling of the control API's bodies and of a session's own
    (`session_max_body_bytes`)."""
    header_timeout_s: float = Field(
        default=10.0, ge=0.001, description="s a request head may take; then the connection is cut"
    )
    """Against slowloris: a request head must arrive within this."""
    tokenize_offload_chars: int = Field(
        default=16384, ge=0, description="tokenize new text this long in a worker process (0: off)"
    )
    """See gateway/prompt/tokenize_pool.py."""
    engine_routing: EngineRouting = Field(
        default="sticky",
        description="sticky: a session keeps its engine; round-robin: compare",
    )
    engine_api: EngineName = Field(
        default="completions",
        description="completions: /v1/completions; generate: vLLM's token-in/token-out "
        "/inference/v1/generate (vLLM >= 0.32 with --enable-scale-out; leaner); "
        "sglang: SGLang's native /generate (e.g. a trainer's own SGLang engines)",
    )
    checkpoint_roots: Annotated[list[Path], OptionSpec(name="--checkpoint-root")] = Field(
        default_factory=list,
        description="directory policy-update checkpoints must resolve under (repeatable); "
        "none: POST /policy is refused",
    )
    """Symlinks followed; with none every `POST /policy` is refused (403)."""

    request_timeout_s: Annotated[float, NOT_AN_OPTION] = 600.0
    peer_control_urls: Annotated[list[str], NOT_AN_OPTION] = Field(default_factory=list)
    """The other processes' control URLs (set by `serve` for N processes): a policy
    update on any process pauses them all, as they share the engines."""
    tokenize_workers: Annotated[int, NOT_AN_OPTION] = Field(default=1, ge=1)
    control_own_loop: Annotated[bool, NOT_AN_OPTION] = True
    """The control listener on its own thread and event loop (False: on the agent
    listener's loop, to measure what that buys; bench/control_listener.py)."""

    @field_validator("checkpoint_roots")
    @classmethod
    def _absolute(cls, roots: list[Path]) -> list[Path]:
        return [root.resolve() for root in roots]

    @property
    def routing_shape(self) -> RoutingShape | None:
        """The model's (MoE layers, top_k) when both are given."""
        layers, top_k = self.routed_experts_layers, self.routed_experts_top_k
        return (layers, top_k) if layers is not None and top_k is not None else None

    @model_validator(mode="after")
    def _routing_possible(self) -> "GatewaySettings":
        """`--routed-experts` with an engine API that cannot return them is refused here,
        before anything starts."""
        if (self.routed_experts_layers is None) != (self.routed_experts_top_k is None):
            raise ValueError("give --routed-experts-layers and --routed-experts-top-k together")
        if self.routed_experts:
            why = routing_unavailable(self.engine_api, self.routing_shape)
            if why is not None:
                raise ValueError(f"--routed-experts: {why}")
        return self
