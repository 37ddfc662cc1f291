"""Incremental tokenization with held tokens (ARCHITECTURE §5). Pure logic: no I/O, no HTTP.

Per session the Gateway holds token segments: the ids it sent to the engine plus the ids
the engine sampled. When the agent's next request repeats a held conversation (possibly
re-formatted, or without the reasoning it never saw), the held ids are reused verbatim
and only the text the template adds after our previous reply is tokenized. Re-rendering
and re-encoding the whole history would not give back the sampled ids: templates drop
earlier reasoning, and decode→encode merges tokens differently.

Finding that new text (the "boundary"): the request is rendered once with a generation
prompt. The end of our previous reply in that text is located by counting end-of-turn
markers (the stop tokens the engine emits, e.g. `<|im_end|>`): the held segment knows how
many its ids contain. The count survives templates that re-render earlier turns
differently (dropped reasoning) as long as they render the same number of markers. A
second locator anchors on the new messages' own text from the end, for templates whose
marker count drifts because sampled replies contained extra markers that a re-render
drops (gpt-oss analysis `<|end|>`). Either result is used only after checks: our reply's
tool calls or content are visible just before the boundary, and the new messages are
visible in order after it, the first one before any further marker. Otherwise the call
forks: a fresh segment tokenized from scratch, never silently wrong tokens.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tokenizers

from gateway.canonical import Message, Tool
from gateway.chat_template import ChatTemplate
from schemas.trajectory import MatchKind

__all__ = [
    "DEFAULT_NORMALISERS",
    "HeldSegment",
    "IncrementalTokenizer",
    "Normaliser",
    "PromptPlan",
    "SegmentView",
    "Tokenizer",
    "TokenizersAdapter",
    "hash_template_kwargs",
    "hash_tools",
    "load_tokenizer",
    "message_key",
]


# -- tokenizer ------------------------------------------------------------------------


class Tokenizer(Protocol):
    """Text ↔ ids. `encode` must recognise added/special tokens written in the text."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TokenizersAdapter:
    """A `tokenizers.Tokenizer` (tokenizer.json) as a `Tokenizer`.

    No special tokens are added on encode: the chat template writes BOS itself, as
    transformers' `apply_chat_template(tokenize=True)` assumes.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def from_file(cls, path: str | Path) -> TokenizersAdapter:
        return cls(tokenizers.Tokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | Path) -> TokenizersAdapter:
    """The `Tokenizer` for a tokenizer.json file."""
    return TokenizersAdapter.from_file(path)


# -- message comparison ---------------------------------------------------------------


def message_key(message: Message) -> bytes:
    """Cheap strict-equality key for a message."""
    return hashlib.blake2b(message.model_dump_json().encode(), digest_size=16).digest()


def _stable_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def hash_tools(tools: Sequence[Tool]) -> str:
    return _stable_hash([t.model_dump() for t in tools])


def hash_template_kwargs(kwargs: Mapping[str, Any]) -> str:
    return _stable_hash(dict(kwargs))


Pair = tuple[Message, Message]


@dataclass(frozen=True)
class Normaliser:
    """A named, composable rule making a held message and its echo comparable.

    `apply(held, echoed)` returns both messages rewritten; applying it must not change
    messages it does not concern.
    """

    name: str
    apply: Callable[[Message, Message], Pair]


def _drop_missing_reasoning(held: Message, echoed: Message) -> Pair:
    """Clients drop reasoning they were shown (or never got) when echoing our replies."""
    if held.reasoning and echoed.reasoning:
        return held, echoed
    return (
        held.model_copy(update={"reasoning": None}),
        echoed.model_copy(update={"reasoning": None}),
    )


def _content_none_as_empty(held: Message, echoed: Message) -> Pair:
    return (
        held.model_copy(update={"content": held.content or ""}),
        echoed.model_copy(update={"content": echoed.content or ""}),
    )


def _strip(message: Message) -> Message:
    update = {
        "content": message.content.strip() if message.content is not None else None,
        "reasoning": message.reasoning.strip() if message.reasoning is not None else None,
    }
    return message.model_copy(update=update)


def _strip_whitespace(held: Message, echoed: Message) -> Pair:
    return _strip(held), _strip(echoed)


def _canonical_arguments(text: str) -> str:
    try:
        return json.dumps(
            json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    except ValueError:
        return text


def _with_arguments(message: Message) -> Message:
    calls = [
        c.model_copy(update={"arguments": _canonical_arguments(c.arguments)})
        for c in message.tool_calls
    ]
    return message.model_copy(update={"tool_calls": calls})


def _reserialised_arguments(held: Message, echoed: Message) -> Pair:
    return _with_arguments(held), _with_arguments(echoed)


def _rewritten_ids(held: Message, echoed: Message) -> Pair:
    """Clients may rename tool-call ids (and the tool results' references to them)."""
    if len(held.tool_calls) == len(echoed.tool_calls) and held.tool_calls:
        calls = [
            e.model_copy(update={"id": h.id})
            for h, e in zip(held.tool_calls, echoed.tool_calls, strict=True)
        ]
        echoed = echoed.model_copy(update={"tool_calls": calls})
    if held.tool_call_id is not None and echoed.tool_call_id is not None:
        echoed = echoed.model_copy(update={"tool_call_id": held.tool_call_id})
    return held, echoed


DEFAULT_NORMALISERS: tuple[Normaliser, ...] = (
    Normaliser("reasoning dropped by client", _drop_missing_reasoning),
    Normaliser("content None vs empty", _content_none_as_empty),
    Normaliser("surrounding whitespace", _strip_whitespace),
    Normaliser("tool-call arguments re-serialised", _reserialised_arguments),
    Normaliser("tool-call ids rewritten", _rewritten_ids),
)


# -- held state and plans -------------------------------------------------------------


@dataclass(frozen=True)
class SegmentView:
    """A segment's training view: first prompt, then everything after it (aligned)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


@dataclass(eq=False)
class HeldSegment:
    """One token-contiguous conversation the Gateway holds.

    `messages` ends with our latest reply as sampled (with reasoning); earlier ones are
    as the client last echoed them. `ids` only ever grows, so `ids[:n]` of an older
    version is still valid. `marker_count` counts end-of-turn markers in `ids`;
    `internal_markers` those sampled inside replies (not as the final stop token).
    """

    segment_id: str
    parent_id: str | None
    messages: list[Message]
    message_keys: list[bytes]
    tools_hash: str
    kwargs_hash: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    prompt_length: int
    marker_count: int
    internal_markers: int
    reply_finished: bool
    version: int = 0
    calls: int = 1
    touched: int = 0

    def export(self) -> SegmentView:
        p = self.prompt_length
        return SegmentView(
            prompt_ids=self.ids[:p],
            response_ids=self.ids[p:],
            loss_mask=self.mask[p:],
            logprobs=self.logprobs[p:],
        )


@dataclass(eq=False)
class PromptPlan:
    """What to send for one call, and how it relates to the held tokens.

    For clean/realign, `prompt_ids[:base_length]` equals the held ids and the rest is the
    newly tokenized text (`new_text`). For fork, everything is new (`base_length` 0).
    """

    kind: MatchKind
    segment_id: str
    parent_id: str | None
    prompt_ids: list[int]
    new_token_count: int
    drift: list[str]
    base_length: int
    messages: list[Message]
    new_text: str
    boundary: str | None = None
    """How the end of our previous reply was found: "count" or "anchor" (None on fork)."""
    fork_reason: str | None = None
    tools_hash: str = ""
    kwargs_hash: str = ""
    message_keys: list[bytes] = field(default_factory=list, repr=False)
    prompt_markers: int = 0
    prompt_internal_markers: int = 0
    base_version: int = 0
    segment: HeldSegment | None = field(default=None, repr=False)


@dataclass
class _Match:
    segment: HeldSegment | None = None
    drift: list[str] = field(default_factory=list)
    parent: HeldSegment | None = None
    parent_common: int = 0
    reason: str = "no held segment starts like this conversation"


def _changes(normaliser: Normaliser, held: Message, echoed: Message) -> bool:
    return normaliser.apply(held, echoed) != (held, echoed)


def _equal_after(normalisers: Sequence[Normaliser], held: Message, echoed: Message) -> bool:
    for normaliser in normalisers:
        held, echoed = normaliser.apply(held, echoed)
    return held == echoed


def _new_segment_id() -> str:
    return f"seg_{uuid.uuid4().hex[:16]}"


def _text_forms(text: str | None) -> list[str]:
    """How a text may appear in a rendering: as is, trimmed, or JSON-escaped."""
    raw = text or ""
    forms: list[str] = []
    for form in (
        raw,
        raw.strip(),
        json.dumps(raw.strip(), ensure_ascii=False)[1:-1],
        json.dumps(raw.strip())[1:-1],
    ):
        if form.strip() and form not in forms:
            forms.append(form)
    return forms


def _anchors(message: Message) -> list[list[str]]:
    """Texts of a message that any sensible template renders, each with its variants."""
    anchors = [[c.name, c.id] for c in message.tool_calls]
    if message.content and message.content.strip():
        anchors.insert(0, _text_forms(message.content))
    return anchors


def _find_any(text: str, forms: Sequence[str], start: int, end: int) -> int:
    hits = [p for p in (text.find(f, start, end) for f in forms) if p >= 0]
    return min(hits) if hits else -1


# -- the planner ----------------------------------------------------------------------


Segments = MutableSequence[HeldSegment] | MutableMapping[str, HeldSegment]
"""A session's held segments: a list, or a dict keyed by segment id."""


class IncrementalTokenizer:
    """Plans prompts against held segments and commits the engine's output to them.

    `eot_token` is the end-of-turn marker (or several, e.g. gpt-oss `<|end|>`, `<|call|>`,
    `<|return|>`): what the engine stops on and the template closes assistant turns with.
    Default: the template's EOS. Each must encode to a single token. `reasoning_tags`
    are only used by `prompt_opens_reasoning`. Not thread-safe: call `prepare`/`commit`
    from one event loop (they never await).
    """

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        *,
        eot_token: str | Sequence[str] | None = None,
        reasoning_tags: tuple[str, str] = ("<think>", "</think>"),
        normalisers: Sequence[Normaliser] = DEFAULT_NORMALISERS,
        new_segment_id: Callable[[], str] = _new_segment_id,
    ) -> None:
        self.template = template
        self.tokenizer = tokenizer
        markers = eot_token or template.eos_token
        self.end_of_turn = (markers,) if isinstance(markers, str) else tuple(markers)
        self.reasoning_tags = reasoning_tags
        self.normalisers = tuple(normalisers)
        self._new_id = new_segment_id
        self._marker_ids = frozenset(self._single_token(m) for m in self.end_of_turn)
        alternatives = sorted(self.end_of_turn, key=len, reverse=True)
        self._marker_re = re.compile("|".join(re.escape(m) for m in alternatives))
        self._clock = itertools.count(1)

    def _single_token(self, marker: str) -> int:
        ids = self.tokenizer.encode(marker)
        if len(ids) != 1:
            raise ValueError(f"end-of-turn marker {marker!r} is not a single token: {ids}")
        return ids[0]

    def count_markers(self, ids: Iterable[int]) -> int:
        return sum(1 for i in ids if i in self._marker_ids)

    def prompt_opens_reasoning(self, prompt_ids: Sequence[int], window: int = 64) -> bool:
        """Does the prompt end inside an opened reasoning block (generation prompt `<think>`)?

        Looks only at the tail after the last end-of-turn marker (at most `window` ids),
        so the cost does not grow with the conversation.
        """
        tail: list[int] = []
        for token in reversed(prompt_ids[-window:]):
            if token in self._marker_ids:
                break
            tail.append(token)
        text = self.tokenizer.decode(tail[::-1])
        opened, closed = (text.rfind(tag) for tag in self.reasoning_tags)
        return opened > closed

    # -- prepare ----------------------------------------------------------------------

    def prepare(
        self,
        segments: Iterable[HeldSegment] | Mapping[str, HeldSegment],
        messages: Sequence[Message],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> PromptPlan:
        """Plan the prompt ids for a request; raises `TemplateRenderError` on bad input."""
        if isinstance(segments, Mapping):
            segments = segments.values()
        messages = list(messages)
        kwargs = dict(template_kwargs or {})
        text = self.template.render(messages, tools, add_generation_prompt=True, **kwargs)
        keys = [message_key(m) for m in messages]
        tools_hash, kwargs_hash = hash_tools(tools), hash_template_kwargs(kwargs)
        match = self._match(segments, messages, keys, tools_hash, kwargs_hash)
        common = dict(
            messages=messages, message_keys=keys, tools_hash=tools_hash, kwargs_hash=kwargs_hash
        )
        if match.segment is not None:
            located = self._locate(match.segment, text, messages)
            if isinstance(located, tuple):
                return self._extend(match, text, located, **common)
            match.parent, match.reason = match.segment, located
        return self._fork(text, match, **common)

    def _extend(
        self, match: _Match, text: str, located: tuple[int, str], **common: Any
    ) -> PromptPlan:
        seg = match.segment
        assert seg is not None
        boundary, method = located
        new_text = text[boundary:]
        new_ids = self.tokenizer.encode(new_text)
        new_markers = self.count_markers(new_ids)
        return PromptPlan(
            kind=MatchKind.realign if match.drift else MatchKind.clean,
            segment_id=seg.segment_id,
            parent_id=seg.parent_id,
            prompt_ids=seg.ids + new_ids,
            new_token_count=len(new_ids),
            drift=match.drift,
            base_length=len(seg.ids),
            new_text=new_text,
            boundary=method,
            prompt_markers=seg.marker_count + new_markers,
            prompt_internal_markers=seg.internal_markers,
            base_version=seg.version,
            segment=seg,
            **common,
        )

    def _fork(self, text: str, match: _Match, **common: Any) -> PromptPlan:
        ids = self.tokenizer.encode(text)
        return PromptPlan(
            kind=MatchKind.fork,
            segment_id=self._new_id(),
            parent_id=match.parent.segment_id if match.parent else None,
            prompt_ids=ids,
            new_token_count=len(ids),
            drift=[],
            base_length=0,
            new_text=text,
            fork_reason=match.reason,
            prompt_markers=self.count_markers(ids),
            **common,
        )

    # -- matching ---------------------------------------------------------------------

    def _match(
        self,
        segments: Iterable[HeldSegment],
        messages: list[Message],
        keys: list[bytes],
        tools_hash: str,
        kwargs_hash: str,
    ) -> _Match:
        """Longest, then most recent, held segment whose messages prefix the request."""
        result = _Match()
        for seg in sorted(segments, key=lambda s: (len(s.messages), s.touched), reverse=True):
            common, drift = self._common_prefix(seg, messages, keys)
            held = len(seg.messages)
            if common == held and len(messages) > held:
                if seg.tools_hash != tools_hash:
                    reason = "tools changed"
                elif seg.kwargs_hash != kwargs_hash:
                    reason = "template kwargs changed"
                else:
                    return _Match(segment=seg, drift=drift)
            elif common == len(messages):
                reason = "request does not go beyond the held messages (retry or rewind)"
            else:
                reason = f"history differs from held segment at message {common}"
            if common > result.parent_common and self._meaningful(messages, common):
                result = _Match(parent=seg, parent_common=common, reason=reason)
        return result

    @staticmethod
    def _meaningful(messages: list[Message], common: int) -> bool:
        """A shared system prompt alone does not make one conversation another's parent."""
        return any(m.role != "system" for m in messages[:common])

    def _common_prefix(
        self, seg: HeldSegment, messages: list[Message], keys: list[bytes]
    ) -> tuple[int, list[str]]:
        drift: list[str] = []
        for i, (held, key) in enumerate(zip(seg.messages, seg.message_keys, strict=True)):
            if i >= len(messages):
                return i, drift
            if key == keys[i]:
                continue
            forgiven = self._forgive(held, messages[i])
            if forgiven is None:
                return i, drift
            drift.append(f"message {i} ({held.role}): {', '.join(forgiven)}")
        return len(seg.messages), drift

    def _forgive(self, held: Message, echoed: Message) -> list[str] | None:
        """Names of the normalisers needed to make the two equal, or None if none do."""
        if held.role != echoed.role:
            return None
        used = [n for n in self.normalisers if _changes(n, held, echoed)]
        if not _equal_after(used, held, echoed):
            return None
        # Report only what was needed: a normaliser that merely canonicalised two
        # already-equal fields is not drift.
        needed = [
            n for n in used if not _equal_after([m for m in used if m is not n], held, echoed)
        ]
        return [n.name for n in needed or used]

    # -- boundary ---------------------------------------------------------------------

    def _locate(
        self, seg: HeldSegment, text: str, messages: list[Message]
    ) -> tuple[int, str] | str:
        """(boundary offset, method) in `text`, or the reason it cannot be trusted.

        The count locator is used when it verifies and the anchor locator (if it found
        anything) agrees. The anchor locator alone is used only when the count failed,
        within the drift window that sampled internal markers allow, and it verifies.
        """
        spans = [(m.start(), m.end()) for m in self._marker_re.finditer(text)]
        held = len(seg.messages)
        reply, new = messages[held - 1], messages[held:]
        # Index of the marker closing our reply: the last held one if we sampled it, else
        # the next one (the template closes a reply cut by max_tokens).
        counted = seg.marker_count - 1 if seg.reply_finished else seg.marker_count
        anchored = self._anchor_index(text, spans, new)

        def verified(index: int) -> int | None:
            if not 0 <= index < len(spans):
                return None
            seen = self._reply_visible(text, spans, index, reply)
            if seen is False or (seen is None and anchored != counted):
                return None
            boundary = spans[index][1] if seg.reply_finished else spans[index][0]
            return boundary if self._new_visible(text, spans, index, boundary, new) else None

        by_count = verified(counted)
        if by_count is not None:
            if anchored is None or anchored == counted:
                return by_count, "count"
            return "end-of-turn count and new-message anchors disagree on where our reply ends"
        if anchored is not None and counted - seg.internal_markers <= anchored < counted:
            by_anchor = verified(anchored)
            if by_anchor is not None:
                return by_anchor, "anchor"
        if counted >= len(spans):
            return (
                f"end of our previous reply not found: {len(spans)} end-of-turn markers "
                f"rendered, held segment has {seg.marker_count}"
            )
        return "end of our previous reply could not be verified in the rendered request"

    def _anchor_index(
        self, text: str, spans: list[tuple[int, int]], new: list[Message]
    ) -> int | None:
        """Index of the last marker before the first new message, found from the end."""
        end = len(text)
        for position, message in reversed(list(enumerate(new))):
            anchors = _anchors(message)
            if not anchors:
                if position == 0:
                    return None
                continue
            hits = [max(text.rfind(f, 0, end) for f in forms) for forms in anchors]
            if min(hits) < 0:
                return None
            end = min(hits)
        index = bisect.bisect_right([e for _, e in spans], end) - 1
        return index if index >= 0 else None

    @staticmethod
    def _reply_visible(
        text: str, spans: list[tuple[int, int]], index: int, reply: Message
    ) -> bool | None:
        """Is our reply rendered just before marker `index`? None if it has nothing to see."""
        span = text[spans[index - 1][1] if index > 0 else 0 : spans[index][0]]
        if reply.tool_calls:
            return all(c.name in span or c.id in span for c in reply.tool_calls)
        forms = _text_forms(reply.content)
        return any(f in span for f in forms) if forms else None

    @staticmethod
    def _new_visible(
        text: str, spans: list[tuple[int, int]], index: int, boundary: int, new: list[Message]
    ) -> bool:
        """New messages appear in order after the boundary, the first before any marker."""
        next_marker = spans[index + 1][0] if index + 1 < len(spans) else len(text)
        cursor = boundary
        for position, message in enumerate(new):
            for forms in _anchors(message):
                hit = _find_any(text, forms, cursor, len(text))
                if hit < 0 or (position == 0 and hit >= next_marker):
                    return False
                cursor = hit
        return True

    # -- commit -----------------------------------------------------------------------

    def commit(
        self,
        segments: Segments,
        plan: PromptPlan,
        output_ids: Sequence[int],
        output_logprobs: Sequence[float],
        reply: Message,
        finished_with_eot: bool,
    ) -> HeldSegment:
        """Record what the engine sampled for `plan`; returns the segment now holding it.

        A fork plan creates its segment. A clean/realign plan extends its segment unless
        that segment advanced since `prepare` (a concurrent call): then the call goes to
        a new segment (parent: the advanced one) and the returned id differs from
        `plan.segment_id` — record the call as a fork. New segments are added to
        `segments`. `finished_with_eot` counts only if the last sampled id is an
        end-of-turn marker; any other stop leaves the turn for the template to close.
        """
        if len(output_logprobs) != len(output_ids):
            raise ValueError("output_logprobs must align with output_ids")
        finished = bool(finished_with_eot and output_ids and output_ids[-1] in self._marker_ids)
        markers = self.count_markers(output_ids)
        seg = plan.segment
        if plan.kind is not MatchKind.fork and seg is not None and seg.version == plan.base_version:
            self._append(seg, plan, output_ids, output_logprobs, reply, finished, markers)
            return seg
        conflict = plan.kind is not MatchKind.fork
        created = HeldSegment(
            segment_id=self._new_id() if conflict else plan.segment_id,
            parent_id=seg.segment_id if conflict and seg is not None else plan.parent_id,
            messages=[*plan.messages, reply],
            message_keys=[*plan.message_keys, message_key(reply)],
            tools_hash=plan.tools_hash,
            kwargs_hash=plan.kwargs_hash,
            ids=[*plan.prompt_ids, *output_ids],
            mask=[0] * len(plan.prompt_ids) + [1] * len(output_ids),
            logprobs=[0.0] * len(plan.prompt_ids) + [float(x) for x in output_logprobs],
            prompt_length=len(plan.prompt_ids),
            marker_count=plan.prompt_markers + markers,
            internal_markers=plan.prompt_internal_markers + markers - int(finished),
            reply_finished=finished,
            touched=next(self._clock),
        )
        if isinstance(segments, MutableMapping):
            segments[created.segment_id] = created
        else:
            segments.append(created)
        return created

    def _append(
        self,
        seg: HeldSegment,
        plan: PromptPlan,
        output_ids: Sequence[int],
        output_logprobs: Sequence[float],
        reply: Message,
        finished: bool,
        markers: int,
    ) -> None:
        new_ids = plan.prompt_ids[plan.base_length :]
        seg.ids.extend(new_ids)
        seg.mask.extend([0] * len(new_ids))
        seg.logprobs.extend([0.0] * len(new_ids))
        seg.ids.extend(output_ids)
        seg.mask.extend([1] * len(output_ids))
        seg.logprobs.extend(float(x) for x in output_logprobs)
        seg.messages = [*plan.messages, reply]
        seg.message_keys = [*plan.message_keys, message_key(reply)]
        seg.marker_count = plan.prompt_markers + markers
        seg.internal_markers += markers - int(finished)
        seg.reply_finished = finished
        seg.version += 1
        seg.calls += 1
        seg.touched = next(self._clock)

    # -- restart ----------------------------------------------------------------------

    def rebuild(
        self,
        *,
        segment_id: str,
        parent_id: str | None,
        calls: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float], bool]],
        messages: Sequence[Message],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> HeldSegment:
        """Rebuild a held segment from its recorded calls after a restart.

        `calls` are (prompt_ids, output_ids, output_logprobs, finished_with_eot) in order;
        each prompt must extend the ids before it. `messages` are the last call's request
        messages followed by its reply.
        """
        if not calls:
            raise ValueError("a segment needs at least one call")
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        internal, finished = 0, False
        for prompt_ids, output_ids, output_logprobs, eot in calls:
            if list(prompt_ids[: len(ids)]) != ids:
                raise ValueError("a call's prompt does not extend the segment's previous ids")
            new = list(prompt_ids[len(ids) :])
            ids += new + list(output_ids)
            mask += [0] * len(new) + [1] * len(output_ids)
            logprobs += [0.0] * len(new) + [float(x) for x in output_logprobs]
            finished = bool(eot and output_ids and output_ids[-1] in self._marker_ids)
            internal += self.count_markers(output_ids) - int(finished)
        messages = list(messages)
        return HeldSegment(
            segment_id=segment_id,
            parent_id=parent_id,
            messages=messages,
            message_keys=[message_key(m) for m in messages],
            tools_hash=hash_tools(tools),
            kwargs_hash=hash_template_kwargs(template_kwargs or {}),
            ids=ids,
            mask=mask,
            logprobs=logprobs,
            prompt_length=len(calls[0][0]),
            marker_count=self.count_markers(ids),
            internal_markers=internal,
            reply_finished=finished,
            calls=len(calls),
            touched=next(self._clock),
        )
