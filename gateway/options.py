"""Settings of one gateway process that its sessions and its call pipeline read.

`CoreSettings` is what an operator sets and the core reads as given; `rollout gateway`'s
settings (`workers.gateway_settings.GatewaySettings`) extend it, and so does
`GatewayOptions`, which adds what the process resolves at start. Each setting is declared
once, here or there, and its command-line option is generated from the field."""

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.capture.store import Durability


@dataclass(frozen=True)
class OptionSpec:
    """Field metadata (in `Annotated`): how a settings field is offered on a command line
    where that differs from `--field-name` parsing the field's own type (the generator is
    `workers.model_options`). `name`: the option's name (a bool named so is a flag with no
    `--no-` form); `type`: what the option parses, which the field's validator converts;
    `envvar`: read when the option is not given; `offered`: False for a field the program
    sets (a supervisor, an in-process caller), not its operator."""

    name: str | None = None
    type: Any = None
    envvar: str | None = None
    offered: bool = True


NOT_AN_OPTION = OptionSpec(offered=False)


class CoreSettings(BaseModel):
    """What the operator of a gateway process sets that the core reads as given."""

    model_config = ConfigDict(extra="forbid")

    data_dir: Path = Path("./data/gateway")
    fsync: Durability = Field(
        default="group",
        description="group: answer a call once its record is fsynced; off: no fsync",
    )
    """`group`: a call is answered only once its record is fsynced (batched); `off`: once
    it is written (survives a gateway crash, not a machine crash)."""
    fsync_interval_ms: float = Field(
        default=5.0, ge=0.001, le=1000, description="group commit: ms between fsync batches"
    )
    session_reaper_interval_s: float = Field(
        default=30.0, ge=0, description="s between closing sessions past their TTL (0: off)"
    )
    """How often the session reaper closes sessions past their TTL (0: never; calls to
    an expired session are refused all the same)."""
    stream_abort_grace_s: float = Field(
        default=2.0, ge=0, description="s a stream whose client left keeps sampling for a retry"
    )
    """How long a streamed call whose client left keeps sampling before the engine request
    is cancelled: an SDK that timed out resends within a second, and that retry then
    gets this call's answer instead of a second sample (see `stream_relay`)."""
    body_timeout_s: float = Field(
        default=60.0, ge=0.001, description="s a request body may take after its head; then 408"
    )
    """A request body must have arrived this long after its headers (else 408, and the
    connection is closed): a client that trickles its body holds nothing for longer."""
    session_max_concurrent_calls: int = Field(
        default=16, ge=1, description="per-session default: calls in flight; one more is a 429"
    )
    """Default of `SessionLimits.max_concurrent_calls` (a session's create may set its own)."""
    session_max_stored_request_bytes: int = Field(
        default=2**20,
        ge=0,
        description="per-session default: raw request bytes a call's record keeps",
    )
    """Default of `SessionLimits.max_stored_request_bytes`."""
    session_max_stored_bytes: int = Field(
        default=2**30, ge=1, description="per-session default: bytes of records; past them 413"
    )
    """Default of `SessionLimits.max_stored_bytes`."""
    session_max_body_bytes: int = Field(
        default=8 * 2**20,
        ge=1,
        description="per-session default: an agent request's body, and the bodies read at once",
    )
    """Default of `SessionLimits.max_body_bytes`."""
    session_body_bytes_per_s: int = Field(
        default=4 * 2**20,
        ge=0,
        description="per-session: body bytes a second (bursts: 1 s of it, or a cap)",
    )
    """Bytes of request body a session may send per second on average, in bursts of one
    second's worth or its `max_body_bytes` if more (0: no rate); `limits.body_budget`."""
    max_prompt_messages: int = Field(
        default=10_000, ge=0, description="refuse (413) a request with more messages (0: no cap)"
    )
    max_prompt_chars: int = Field(
        default=4 * 2**20,
        ge=0,
        description="refuse (413) a prompt of more characters (0: no cap)",
    )
    """A request whose messages and tools hold more characters is refused (413) before it
    is rendered or tokenized (0: no cap); see `calls.prompt_limits`."""
    routed_experts: bool = Field(
        default=False,
        description="record every session's routed experts (MoE routing replay; a session "
        "may ask alone); needs --engine-api generate or sglang",
    )
    """Ask the engine for each call's routed experts in every session, not only in those
    whose create asks (`SessionConfig.routed_experts`); see docs/trainers.md."""
    routed_experts_layers: int | None = Field(
        default=None,
        ge=1,
        description="the model's MoE layers: routing of another count is recorded missing "
        "(needed with --engine-api sglang)",
    )
    routed_experts_top_k: int | None = Field(
        default=None,
        ge=1,
        description="experts per token and layer: routing of another width is recorded "
        "missing (needed with --engine-api sglang)",
    )
    parse_offload_bytes: Annotated[int, NOT_AN_OPTION] = Field(default=2**20, ge=0)
    """An agent body of at least this many bytes is parsed (JSON, protocol, prompt caps)
    in a worker process, off this process's GIL (0: never); see `http.body_parse`."""
    advertised_url: Annotated[str | None, NOT_AN_OPTION] = None
    """The one address agents are given when processes share a port (`owner_forwarding`);
    None: this process's own `public_url`, which always identifies the owner. A supervisor
    sets it for its children: `--public-url`, else the shared port."""


class GatewayOptions(CoreSettings):
    """Settings of one gateway process that the core needs: the operator's
    `CoreSettings`, and what the process resolved at start."""

    model_name: str
    public_url: str
    context_window: int
    vocab_size: int | None = None
    """The model's token ids are below this; a `logit_bias` on another id is refused
    before the engine sees it (None: the engine checks)."""
    default_max_tokens: int = 4096
    max_inflight_engine_calls: int = 256
    max_queued_engine_calls: int = 4096
    plan_thread_messages: int = Field(default=128, ge=0)
    """A request of at least this many messages is planned in a thread, off the event
    loop (0: always on the loop)."""
