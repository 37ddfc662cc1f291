"""Recorded calls and segments: the Gateway's token-exact record of a session."""

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, model_validator

from schemas.base import StrictModel
from schemas.conversation import CallConversation
from schemas.routing import RoutedExperts
from schemas.sampling import SamplingParams
from schemas.scenes import Scene


class CallStatus(StrEnum):
    ok = "ok"
    engine_error = "engine_error"
    cancelled = "cancelled"


class MatchKind(StrEnum):
    """How a request's messages related to the tokens already held: a pure extension
    (clean), an extension whose echoed history drifted (realign), or a new segment (fork)."""

    clean = "clean"
    realign = "realign"
    fork = "fork"


class RecordedCall(StrictModel):
    """One agent LLM call exactly as the engine served it."""

    call_id: str
    segment_id: str
    scene: Scene
    protocol: str = Field(min_length=1)
    """The wire protocol of the call, by the name it is registered under in the Gateway
    (`openai_chat`, `openai_responses`, `anthropic_messages`, ...)."""
    path: str
    status: CallStatus
    match: MatchKind
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    new_prompt_tokens: int = Field(ge=0, description="prompt tokens tokenized for this call")
    finish_reason: str | None = None
    sampling: SamplingParams = Field(
        description="what the engine was sent; an unset field was the engine's default"
    )
    sampling_overridden: dict[str, Any] = Field(
        default_factory=dict,
        description="pinned fields the agent asked otherwise: field → the agent's value",
    )
    policy_version: str
    engine_url: str | None = None
    started_at: datetime
    duration_s: float = Field(ge=0.0)
    error: str | None = None
    parse_error: str | None = None
    drift: list[str] = Field(
        default_factory=list,
        description="what realign forgave, and the marker that closed a reply cut at max_tokens",
    )
    fork_reason: str | None = Field(
        default=None, description="why this call did not extend a held segment"
    )
    conversation: CallConversation | None = Field(
        default=None,
        description="what the protocol carried: the messages new since the segment's "
        "previous call (filled in from the record's normalized request, where they are "
        "stored), the tools by name and the parsed reply (None: an older record)",
    )
    routed_experts: RoutedExperts | None = Field(
        default=None,
        description="the engine's expert routing of prompt_ids[start:] + output_ids[:-1] "
        "(a session that asked for routing; `schemas.routing`)",
    )
    routing_missing: str | None = Field(
        default=None,
        description="why a call of a session that asked for routing has none recorded",
    )

    @model_validator(mode="after")
    def _logprobs_align(self) -> "RecordedCall":
        if len(self.output_logprobs) != len(self.output_ids):
            raise ValueError("output_logprobs must align with output_ids")
        return self


class Segment(StrictModel):
    """One token-contiguous conversation: first prompt, then everything after it.

    `loss_mask` is 1 exactly on sampled tokens; `logprobs` is the engine's on those and
    0.0 elsewhere. Both align with `response_ids`.
    """

    segment_id: str
    parent_id: str | None = None
    link: Literal["continues", "spawned_by"] | None = None
    scene: Scene
    trainable: bool
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    call_ids: list[str]
    call_starts: list[int] = Field(
        default_factory=list,
        description="where each call's sampled tokens begin in response_ids (per call_ids)",
    )
    routed_experts: RoutedExperts | None = Field(
        default=None,
        description="the routing of every token of prompt_ids + response_ids but the last, "
        "spliced from its calls' (None: not asked for, or not all of it recorded)",
    )
    routing_missing: str | None = Field(
        default=None, description="why a segment of a session that asked for routing has none"
    )
    routing_rereads: int = Field(
        default=0, ge=0, description="tokens whose routing a later call returned again"
    )
    routing_reread_differs: int = Field(
        default=0,
        ge=0,
        description="of those, the tokens routed otherwise in some layer when read again",
    )

    @model_validator(mode="after")
    def _aligned(self) -> "Segment":
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError("loss_mask and logprobs must align with response_ids")
        routing = self.routed_experts
        if routing is not None and (
            routing.start != 0 or routing.tokens != len(self.prompt_ids) + n - 1
        ):
            raise ValueError("routed_experts must cover prompt_ids + response_ids[:-1]")
        return self


class Trajectory(StrictModel):
    """Reply of `GET /sessions/{id}/trajectory`."""

    session_id: str
    rollout_id: str
    policy_version: str
    closed: bool
    prompt_template_version: str
    calls: list[RecordedCall]
    segments: list[Segment]
    metadata: dict[str, Any] = Field(default_factory=dict)
    limit_refusals: dict[str, int] = Field(
        default_factory=dict,
        description="the agent's calls a per-session limit refused, by limit name (counted "
        "by the process serving the session since it took it; none are recorded as calls)",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="what a reader should know of the record, naming the calls concerned "
        "(such as a call recorded without the routing its session asked for)",
    )
