"""Settings of one gateway process that its sessions and its call pipeline read."""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gateway.capture.store import Durability


class GatewayOptions(BaseModel):
    """Settings of one gateway process that the core needs."""

    model_config = ConfigDict(extra="forbid")

    model_name: str
    public_url: str
    advertised_url: str | None = None
    """The one address agents are given when processes share a port (`owner_forwarding`);
    None: this process's own `public_url`, which always identifies the owner."""
    data_dir: Path
    context_window: int
    vocab_size: int | None = None
    """The model's token ids are below this; a `logit_bias` on another id is refused
    before the engine sees it (None: the engine checks)."""
    default_max_tokens: int = 4096
    max_inflight_engine_calls: int = 256
    max_queued_engine_calls: int = 4096
    fsync: Durability = "group"
    """`group`: a call is answered only once its record is fsynced (batched); `off`: once
    it is written (survives a gateway crash, not a machine crash)."""
    fsync_interval_ms: float = Field(default=5.0, gt=0)
    """Group commit starts a batch at most this often."""
    session_reaper_interval_s: float = Field(default=30.0, ge=0)
    """How often the session reaper closes sessions past their TTL (0: never; calls to
    an expired session are refused all the same)."""
    max_prompt_messages: int = Field(default=10_000, ge=0)
    """A request with more messages is refused (413) before it is rendered (0: no cap)."""
    max_prompt_chars: int = Field(default=4 * 2**20, ge=0)
    """A request whose messages and tools hold more characters is refused (413) before it
    is rendered or tokenized (0: no cap); see `calls.prompt_limits`."""
    plan_thread_messages: int = Field(default=128, ge=0)
    """A request of at least this many messages is planned in a thread, off the event
    loop (0: always on the loop)."""
    parse_thread_bytes: int = Field(default=2**20, ge=0)
    """An agent body of at least this many bytes has its JSON parsed in a thread, off the
    event loop (0: always on the loop); see bench/control_listener.py."""
    stream_abort_grace_s: float = Field(default=2.0, ge=0)
    """How long a streamed call whose client left keeps sampling before the engine request
    is cancelled: an SDK that timed out resends within a second, and that retry then
    gets this call's answer instead of a second sample (see `stream_relay`)."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """A request body must have arrived this long after its headers (else 408, and the
    connection is closed): a client that trickles its body holds nothing for longer."""
    session_max_concurrent_calls: int = Field(default=16, ge=1)
    """Default of `SessionLimits.max_concurrent_calls`."""
    session_max_stored_request_bytes: int = Field(default=2**20, ge=0)
    """Default of `SessionLimits.max_stored_request_bytes`."""
    session_max_stored_bytes: int = Field(default=2**30, ge=1)
    """Default of `SessionLimits.max_stored_bytes`."""
    session_max_body_bytes: int = Field(default=8 * 2**20, ge=1)
    """Default of `SessionLimits.max_body_bytes`."""
