"""Gateway control API contracts: creating a session and what it returns."""

from datetime import datetime
from typing import Any

from pydantic import Field

from schemas.base import StrictModel
from schemas.sampling import SamplingControl, SamplingParams
from schemas.scenes import SceneConfig

MAX_TTL_S = 30 * 86400.0
"""Longest session lifetime one can ask for; a leaked session must end some day."""


class SessionLimits(StrictModel):
    """What one session may take of its gateway process; None: the process's default
    (`rollout gateway --session-max-…`). The create call is trusted (admin token), so a
    session may ask for more than the default as well as less."""

    max_concurrent_calls: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="agent calls in flight at once; one more is a 429 (retry after 1 s)",
    )
    max_stored_request_bytes: int | None = Field(
        default=None,
        ge=0,
        description="raw request JSON kept per call record; the fields past it are left "
        "out, with the whole part's size and sha256 kept",
    )
    max_stored_bytes: int | None = Field(
        default=None,
        ge=1,
        description="size of the session's records; a call that would pass it is a 413",
    )
    max_body_bytes: int | None = Field(
        default=None,
        ge=1,
        description="one agent request's body (413 past it, before it is read), and the "
        "bodies the session's calls read at once (one more is a 429, retry after 1 s)",
    )


class SessionConfig(StrictModel):
    """Body of `POST /sessions`: everything the Gateway enforces for one rollout."""

    rollout_id: str = Field(min_length=1, max_length=256)
    policy_version: str = Field(default="unversioned", min_length=1, max_length=256)
    sampling: SamplingParams = Field(
        default_factory=SamplingParams, description="the policy's sampling values"
    )
    sampling_control: SamplingControl = Field(
        default_factory=SamplingControl,
        description="per field: pinned to `sampling` (unset: the engine's default) or the "
        "agent's to choose; the default pins all that shapes the token distribution",
    )
    scenes: SceneConfig = Field(default_factory=SceneConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="a retried create with the same key returns the same session and token",
    )
    idle_ttl_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TTL_S,
        description="closed after this long without an agent call (None: never)",
    )
    absolute_ttl_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TTL_S,
        description="closed this long after its creation, whatever it does (None: never)",
    )
    limits: SessionLimits = Field(default_factory=SessionLimits)
    routed_experts: bool = Field(
        default=False,
        description="record each call's routed experts (MoE routing replay); the gateway's "
        "engine must return them (--engine-api generate or sglang)",
    )


class SessionSummary(StrictModel):
    """Reply of `GET /sessions/{id}`: cheap progress numbers, no token IDs."""

    session_id: str
    rollout_id: str
    policy_version: str
    closed: bool
    calls: int
    failed_calls: int
    segments: int


class SessionCreated(StrictModel):
    """Reply of `POST /sessions`: what the sandbox needs to point an agent at us."""

    session_id: str
    token: str
    openai_base_url: str
    anthropic_base_url: str


class SessionListing(StrictModel):
    """One entry of `GET /sessions`: enough for a reaper to decide whether its rollout
    still runs (`metadata` carries the workflow ids of a rollout's session)."""

    session_id: str
    rollout_id: str
    created_at: datetime
    owner_url: str | None
    metadata: dict[str, Any]


class SessionList(StrictModel):
    """Reply of `GET /sessions`: the open sessions on the gateway's data dir."""

    sessions: list[SessionListing]
