"""What one agent call leaves on disk: its `RecordedCall` (the trajectory's view) inside a
durable `CallEntry` whose size follows what is new in the call, not the whole history."""

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pydantic_core
from pydantic_core import PydanticSerializationError

from gateway.canonical import CanonicalRequest, Message, ParsedOutput, ToolCall
from gateway.capture.store import CallEntry, PromptRef, RequestOmitted, SessionMeta
from gateway.errors import GatewayError
from gateway.prompt.incremental import PromptPlan
from schemas.conversation import CallConversation, ConvMessage, ConvToolCall, clip_text
from schemas.routing import RoutedExperts
from schemas.sampling import SamplingParams
from schemas.scenes import Scene
from schemas.trajectory import CallStatus, MatchKind, RecordedCall

HISTORY_FIELDS = frozenset({"messages", "input", "system", "instructions", "tools"})
"""Request fields that repeat the conversation; stored in full only when a segment opens."""


@dataclass(frozen=True)
class Reuse:
    """What a planned call takes from a held segment, captured when it is planned."""

    messages: int = 0
    tokens: int = 0
    after_call: str | None = None
    echoed: tuple[int, ...] = ()
    """Held messages the client echoed differently (a realign): the record keeps the echo,
    which the held segment takes on, so a restart can rebuild the segment exactly."""


def reuse_of(plan: PromptPlan, last_call: Mapping[str, str]) -> Reuse:
    """What `plan` reuses; `last_call` maps each held segment to its latest call."""
    if plan.kind is MatchKind.fork or plan.segment is None:
        return Reuse()
    held = plan.segment.message_keys
    echoed = (
        tuple(i for i, key in enumerate(held) if key != plan.message_keys[i])
        if plan.kind is MatchKind.realign
        else ()
    )
    return Reuse(
        len(plan.segment.messages), plan.base_length, last_call.get(plan.segment_id), echoed
    )


@dataclass(frozen=True)
class PlannedCall:
    """One agent call once its prompt is planned: what its record holds whatever the outcome."""

    meta: SessionMeta
    request: CanonicalRequest
    plan: PromptPlan
    reuse: Reuse
    scene: Scene
    sampling: SamplingParams
    """What the engine is sent (`SamplingControl.apply` and the context window's cap)."""
    call_id: str
    started_at: datetime
    wall_start: float
    """`time.perf_counter()` when the call arrived."""
    stored: "StoredRequest"
    """The request parts the record keeps (`stored_request`), encoded once when planned."""
    digest: str | None = None
    """The request body's digest (`retries.request_digest`), kept in the record."""
    policy_version: str | None = None
    """The version the gateway served when the engine call was admitted (set by a policy
    update); None: the session's label, as no update has named one."""
    sampling_overridden: dict[str, Any] = field(default_factory=dict)
    """Pinned fields the agent asked otherwise: field → the agent's value (JSON)."""
    routing_from: int | None = None
    """The first prompt token whose routed experts the engine is asked for (None: the
    session does not record routing; `calls.routing`)."""

    def record(
        self,
        *,
        segment_id: str,
        status: CallStatus,
        match: MatchKind,
        output_ids: list[int],
        output_logprobs: list[float],
        fork_reason: str | None,
        finish_reason: str | None = None,
        parse_error: str | None = None,
        drift: list[str] | None = None,
        error: str | None = None,
        reply: ParsedOutput | None = None,
        routed_experts: RoutedExperts | None = None,
        routing_missing: str | None = None,
    ) -> CallEntry:
        """What the store appends for the call, with the outcome-specific fields given
        (`reply`: the parsed reply of a call that sampled one): the request parts that are
        new, and only the prompt tokens past the held ones when it extends an earlier call
        (`entry.call.prompt_ids`; the store's readers expand them).

        Built without validation: every part is already typed (the engine's validated
        completion, our tokenizer's ids, the parsed request and reply), and validating
        them again would cost a third of the record; what no part checks is checked here."""
        if len(output_logprobs) != len(output_ids):
            raise ValueError("output_logprobs must align with output_ids")
        refers = self.reuse.messages > 0 and self.reuse.after_call is not None
        held = self.reuse.tokens if refers else 0
        call = RecordedCall.model_construct(
            call_id=self.call_id,
            segment_id=segment_id,
            scene=self.scene,
            protocol=self.request.protocol,
            path=self.request.path,
            status=status,
            match=match,
            prompt_ids=self.plan.prompt_ids[held:],
            output_ids=output_ids,
            output_logprobs=output_logprobs,
            new_prompt_tokens=self.plan.new_token_count,
            finish_reason=finish_reason,
            sampling=self.sampling,
            sampling_overridden=self.sampling_overridden,
            policy_version=self.policy_version or self.meta.config.policy_version,
            engine_url=self.meta.engine_url,
            started_at=self.started_at,
            duration_s=time.perf_counter() - self.wall_start,
            error=error,
            parse_error=parse_error,
            drift=drift or [],
            fork_reason=fork_reason,
            conversation=CallConversation.model_construct(  # its messages: `trajectory`
                history=self.reuse.messages,
                messages=[],  # given: model_construct inspects a default factory each call
                tools=[clip_text(t.name) or "" for t in self.request.tools],
                reply=conv_reply(reply) if reply is not None else None,
                finish_reason=finish_reason,
            ),
            routed_experts=routed_experts,
            routing_missing=routing_missing,
        )
        stored = self.stored
        return CallEntry.model_construct(
            kind="call",
            call=call,
            request=stored.raw,
            request_omitted=stored.omitted,
            normalized=stored.normalized,
            prompt_ref=(
                PromptRef.model_construct(call_id=self.reuse.after_call, length=held)
                if refers
                else None
            ),
            request_digest=self.digest,
        )


def stored_request(
    raw: dict[str, Any], request: CanonicalRequest, reuse: Reuse, cap: int | None
) -> "StoredRequest":
    """The request parts a call's record keeps (`_stored_request`), the raw one cut to
    `cap` bytes. A request whose record could not be written (a lone surrogate has no UTF-8
    encoding) is refused, as a 400 naming the field, before the engine or the session
    sees it."""
    parts = _stored_request(raw, request, reuse)
    try:
        return StoredRequest.of(*parts, cap)
    except PydanticSerializationError as exc:
        where = unencodable_path(parts[0]) or unencodable_path(parts[1]) or "request"
        raise GatewayError(
            "invalid_request",
            f"{where}: text that cannot be encoded as UTF-8 (a lone surrogate?)",
            param=where,
        ) from exc


@dataclass(frozen=True)
class StoredRequest:
    """The request parts one call's record keeps, and their encoded size."""

    raw: dict[str, Any]
    normalized: dict[str, Any]
    omitted: RequestOmitted | None
    size_bytes: int
    """JSON bytes of `raw` and `normalized` as stored (what the call adds to the records,
    besides its token ids)."""

    @classmethod
    def of(
        cls, raw: dict[str, Any], normalized: dict[str, Any], cap: int | None
    ) -> "StoredRequest":
        """`normalized` is kept whole (a restart rebuilds held segments from it, and the
        prompt it renders is bounded by the context window); of `raw` (what the agent
        sent, kept for inspection) the fields that fit in `cap`, smallest first."""
        raw_json = pydantic_core.to_json(raw)
        normalized_size = len(pydantic_core.to_json(normalized))
        if cap is None or len(raw_json) <= cap:
            return cls(raw, normalized, None, len(raw_json) + normalized_size)
        kept = _fields_within(raw, cap)
        omitted = RequestOmitted(
            fields=[k for k in raw if k not in kept],
            size_bytes=len(raw_json),
            sha256=hashlib.sha256(raw_json).hexdigest(),
        )
        kept_size = len(pydantic_core.to_json(kept))
        return cls(kept, normalized, omitted, kept_size + normalized_size)


def conv_message(m: Message) -> ConvMessage:
    """A canonical message as the conversation record keeps it (text fields clipped)."""
    return ConvMessage(
        role="developer" if m.developer else m.role,
        content=clip_text(m.content),
        reasoning=clip_text(m.reasoning),
        tool_calls=_conv_tool_calls(m.tool_calls),
        tool_call_id=clip_text(m.tool_call_id),
        name=clip_text(m.name),
    )


def conv_reply(parsed: ParsedOutput) -> ConvMessage:
    return ConvMessage(
        role="assistant",
        content=clip_text(parsed.content),
        reasoning=clip_text(parsed.reasoning),
        tool_calls=_conv_tool_calls(parsed.tool_calls),
    )


def _conv_tool_calls(calls: list[ToolCall]) -> list[ConvToolCall]:
    return [
        ConvToolCall(
            name=clip_text(c.name) or "",
            arguments=clip_text(c.arguments) or "",
            id=clip_text(c.id) or "",
        )
        for c in calls
    ]


def _fields_within(raw: dict[str, Any], cap: int) -> dict[str, Any]:
    """The top-level fields of `raw` that fit in `cap` JSON bytes together, taken smallest
    first (the envelope: model, flags, sampling), in their original order."""
    sizes = {
        k: len(pydantic_core.to_json(k)) + 1 + len(pydantic_core.to_json(v)) for k, v in raw.items()
    }
    chosen: set[str] = set()
    total = 2  # the braces
    for key in sorted(raw, key=lambda k: sizes[k]):
        grown = total + sizes[key] + (1 if chosen else 0)
        if grown > cap:
            break
        chosen.add(key)
        total = grown
    return {k: v for k, v in raw.items() if k in chosen}


def _stored_request(
    raw: dict[str, Any], request: CanonicalRequest, reuse: Reuse
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request parts a call's record keeps, with a size proportional to what is new.

    Agents resend the whole history on every call, and every prompt repeats the held
    tokens; storing either each time would make the capture quadratic. A call that
    extends a held segment keeps the request envelope (sampling, flags, headers) and only
    the messages past the held prefix (plus, as `echoed_history`, held ones it echoed
    differently); its record also keeps only the prompt tokens past the held ones, with a
    reference to the call whose prompt+output they continue. The store expands the
    reference on load, so readers always see complete `prompt_ids`.
    """
    if reuse.messages == 0:
        return raw, request.model_dump()
    envelope = {k: v for k, v in raw.items() if k not in HISTORY_FIELDS}
    normalized = request.model_dump(exclude={"messages", "tools"})
    normalized["history_messages"] = reuse.messages
    normalized["new_messages"] = [m.model_dump() for m in request.messages[reuse.messages :]]
    if reuse.echoed:
        normalized["echoed_history"] = [
            {"index": i, "message": request.messages[i].model_dump()} for i in reuse.echoed
        ]
    return envelope, normalized


def unencodable_path(value: Any, path: str = "") -> str | None:
    """Path (`messages[2].content`) of the first string in `value` with no UTF-8 encoding."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return path or "(root)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            found = unencodable_path(key, here) or unencodable_path(item, here)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = unencodable_path(item, f"{path}[{index}]")
            if found:
                return found
    return None
