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

Rendering a window (cost ∝ new messages, not the conversation): on an extension only the
text after our previous reply is needed, so the common path renders a *window*: the
conversation's head (its leading system messages, for some templates also the first user
message: tools, system prompts and injected defaults are rendered at the top) followed by
our previous reply and the new messages. The reply's closing marker is then found by
count from the start of the window (markers of the head rendered alone, cached, plus the
markers sampled in the reply) and verified as above. Whether a template renders the new
part identically from a window is not assumed: at construction a probe drives several
conversations (tool loops with reasoning, a follow-up query after tool turns, parallel
tool results, a content-only turn, a cut reply, with and without system prompt/tools)
through both paths and enables windowing only if every step gives the same new text
(`IncrementalTokenizer.windowing` says which head, or why not). At runtime a window whose
boundary does not verify falls back to the full render (and that to fork).

Validation in windowed mode: the template sees only the head, our previous reply and the
new messages, so its `raise_exception` checks no longer run over the earlier messages on
every call. Those matched held messages (strictly or through a normaliser), each of which
was inside a rendered window or full render when it was new; a bad *new* message still
raises `TemplateRenderError` (a window that fails to render is retried as a full render,
whose error is raised).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import operator
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tokenizers

from gateway.canonical import Message, Tool, ToolCall
from gateway.chat_template import ChatTemplate, TemplateRenderError
from schemas.trajectory import MatchKind

__all__ = [
    "DEFAULT_NORMALISERS",
    "WINDOW_HEADS",
    "HeldSegment",
    "IncrementalTokenizer",
    "MessageKey",
    "Normaliser",
    "PromptPlan",
    "SegmentView",
    "Tokenizer",
    "TokenizersAdapter",
    "WindowDecision",
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


MessageKey = tuple[tuple[Any, ...], tuple[tuple[Any, ...], ...]]
"""A message's field values (tool calls as tuples of theirs): compared with `==` only."""

_message_fields = operator.attrgetter(*(f for f in Message.model_fields if f != "tool_calls"))
_call_fields = operator.attrgetter(*ToolCall.model_fields)


def message_key(message: Message) -> MessageKey:
    """Cheap strict-equality key for a message: every field, read in C (`attrgetter`).

    Every held message is compared on every call, so this is per-message work that grows
    with the conversation; it shares the message's strings instead of serialising and
    hashing them (about 3x cheaper than a digest of `model_dump_json`).
    """
    return _message_fields(message), tuple(map(_call_fields, message.tool_calls))


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


INJECTED_BLOCK = re.compile(r"\s*<system-reminder>.*?</system-reminder>\s*", re.DOTALL)
"""Claude Code's transient `<system-reminder>` blocks, the common case of injected text."""


def injected_blocks(pattern: re.Pattern[str] = INJECTED_BLOCK) -> Normaliser:
    """Agents inject transient blocks (reminders, environment notes) into turns and drop
    or rewrite them when they resend history; compare the turns without them. The held
    tokens keep what the model actually saw."""

    def strip(message: Message) -> Message:
        if message.content is None or not pattern.search(message.content):
            return message
        return message.model_copy(update={"content": pattern.sub(" ", message.content).strip()})

    def apply(held: Message, echoed: Message) -> Pair:
        return strip(held), strip(echoed)

    return Normaliser("injected blocks", apply)


DEFAULT_NORMALISERS: tuple[Normaliser, ...] = (
    Normaliser("reasoning dropped by client", _drop_missing_reasoning),
    Normaliser("content None vs empty", _content_none_as_empty),
    Normaliser("surrounding whitespace", _strip_whitespace),
    Normaliser("tool-call arguments re-serialised", _reserialised_arguments),
    Normaliser("tool-call ids rewritten", _rewritten_ids),
    injected_blocks(),
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
    `internal_markers` those sampled inside replies (not as the final stop token);
    `reply_markers` those sampled in the latest reply (incl. its stop token), which the
    window render needs to find the reply's end.
    """

    segment_id: str
    parent_id: str | None
    messages: list[Message]
    message_keys: list[MessageKey]
    tools_hash: str
    kwargs_hash: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    prompt_length: int
    marker_count: int
    internal_markers: int
    reply_finished: bool
    reply_markers: int = 0
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
    rendered: str = "full"
    """What was rendered to find the new text: "window" or "full" (the whole request)."""
    window_fallback: str | None = None
    """Why a window render was tried but not used (then the full render was)."""
    fork_reason: str | None = None
    tools_hash: str = ""
    kwargs_hash: str = ""
    message_keys: list[MessageKey] = field(default_factory=list, repr=False)
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


_NOT_FOUND = "end of our previous reply not found"


def _find_any(text: str, forms: Sequence[str], start: int, end: int) -> int:
    hits = [p for p in (text.find(f, start, end) for f in forms) if p >= 0]
    return min(hits) if hits else -1


# -- the planner ----------------------------------------------------------------------


Segments = MutableSequence[HeldSegment] | MutableMapping[str, HeldSegment]
"""A session's held segments: a list, or a dict keyed by segment id."""

WINDOW_HEADS: tuple[str, ...] = ("system", "system+first user")
"""Window heads, in the order the probe tries them: the leading system messages, or those
plus the first user message (templates that put tools into the first user turn, or that
need a user query in the conversation, e.g. Llama 3.1, Qwen3.5)."""

_MAX_CACHED_HEADS = 64
_MAX_KWARGS_DECISIONS = 64


@dataclass(frozen=True)
class WindowDecision:
    """Whether `prepare` renders a window instead of the whole conversation, and why."""

    enabled: bool
    head: str | None
    """One of `WINDOW_HEADS` when enabled."""
    reason: str
    probe_steps: int = 0
    """Probe steps whose window and full new texts were compared (0: no probe ran)."""

    @property
    def mode(self) -> str:
        return "window" if self.enabled else "full"


class IncrementalTokenizer:
    """Plans prompts against held segments and commits the engine's output to them.

    `eot_token` is the end-of-turn marker (or several, e.g. gpt-oss `<|end|>`, `<|call|>`,
    `<|return|>`): what the engine stops on and the template closes assistant turns with.
    Default: the template's EOS. Each must encode to a single token. `reasoning_tags`
    are only used by `prompt_opens_reasoning`. Not thread-safe: call `prepare`/`commit`
    from one event loop (they never await).

    `windowing`: None (default) lets the construction-time probe decide whether
    extensions render only a window (see the module doc); False always renders the whole
    conversation; True forces windowing on (tests, benchmarks), with the head the probe
    accepted or else the largest one. The decision for no template kwargs is
    `self.windowing`; other kwargs sets are probed on first use (`windowing_for`).
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
        windowing: bool | None = None,
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
        self._windowing_setting = windowing
        self._heads: dict[tuple[Any, ...], tuple[str, int]] = {}
        self._decisions: dict[str, WindowDecision] = {}
        self.windowing = self.windowing_for({})

    def _single_token(self, marker: str) -> int:
        ids = self.tokenizer.encode(marker)
        if len(ids) != 1:
            raise ValueError(f"end-of-turn marker {marker!r} is not a single token: {ids}")
        return ids[0]

    def count_markers(self, ids: Iterable[int]) -> int:
        return sum(1 for i in ids if i in self._marker_ids)

    def _count_text_markers(self, text: str) -> int:
        return sum(1 for _ in self._marker_re.finditer(text))

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
        """Plan the prompt ids for a request; raises `TemplateRenderError` on bad input.

        An extension renders only a window when this template's probe allowed it (see
        the module doc); anything that does not verify there is planned from the full
        render, exactly as without windowing.
        """
        if isinstance(segments, Mapping):
            segments = segments.values()
        messages = list(messages)
        kwargs = dict(template_kwargs or {})
        keys = [message_key(m) for m in messages]
        tools_hash, kwargs_hash = hash_tools(tools), hash_template_kwargs(kwargs)
        match = self._match(segments, messages, keys, tools_hash, kwargs_hash)
        common = dict(
            messages=messages, message_keys=keys, tools_hash=tools_hash, kwargs_hash=kwargs_hash
        )
        fallback: str | None = None
        if match.segment is not None:
            decision = self.windowing_for(kwargs, kwargs_hash)
            if decision.enabled and decision.head is not None:
                windowed = self._locate_in_window(
                    match.segment,
                    messages,
                    tools,
                    kwargs,
                    keys,
                    decision.head,
                    (tools_hash, kwargs_hash),
                )
                if isinstance(windowed, tuple):
                    window_text, located = windowed
                    return self._extend(match, window_text, located, "window", None, **common)
                fallback = None if windowed == _WHOLE_CONVERSATION else windowed
        text = self.template.render(messages, tools, add_generation_prompt=True, **kwargs)
        if match.segment is not None:
            located_full = self._locate(match.segment, text, messages)
            if isinstance(located_full, tuple):
                return self._extend(match, text, located_full, "full", fallback, **common)
            match.parent, match.reason = match.segment, located_full
        return self._fork(text, match, fallback, **common)

    def _extend(
        self,
        match: _Match,
        text: str,
        located: tuple[int, str],
        rendered: str,
        fallback: str | None,
        **common: Any,
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
            rendered=rendered,
            window_fallback=fallback,
            prompt_markers=seg.marker_count + new_markers,
            prompt_internal_markers=seg.internal_markers,
            base_version=seg.version,
            segment=seg,
            **common,
        )

    def _fork(self, text: str, match: _Match, fallback: str | None, **common: Any) -> PromptPlan:
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
            window_fallback=fallback,
            prompt_markers=self.count_markers(ids),
            **common,
        )

    # -- matching ---------------------------------------------------------------------

    def _match(
        self,
        segments: Iterable[HeldSegment],
        messages: list[Message],
        keys: list[MessageKey],
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
        self, seg: HeldSegment, messages: list[Message], keys: list[MessageKey]
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
        """(boundary offset, method) in the full rendering `text`, or why it is untrusted."""
        held = len(seg.messages)
        counted = seg.marker_count - 1 if seg.reply_finished else seg.marker_count
        located = self._find_boundary(
            text,
            messages[held - 1],
            messages[held:],
            counted=counted,
            tolerance=seg.internal_markers,
            finished=seg.reply_finished,
        )
        if located is None:
            rendered = self._count_text_markers(text)
            return (
                f"{_NOT_FOUND}: {rendered} end-of-turn markers rendered, held segment has "
                f"{seg.marker_count}"
            )
        return located

    def _find_boundary(
        self,
        text: str,
        reply: Message,
        new: list[Message],
        *,
        counted: int,
        tolerance: int,
        finished: bool,
        floor: int = 0,
    ) -> tuple[int, str] | str | None:
        """(boundary offset, method), a reason, or None when marker `counted` is missing.

        `counted` is the index of the marker closing our reply if the rendering holds as
        many markers before it as were held; up to `tolerance` of those (sampled inside
        replies) may be missing from a re-render. The count locator is used when it
        verifies and the anchor locator (if it found anything) agrees. The anchor locator
        alone is used only when the count failed, within that tolerance, and it verifies.
        The closing marker must start at or after `floor`.
        """
        spans = [(m.start(), m.end()) for m in self._marker_re.finditer(text)]
        anchored = self._anchor_index(text, spans, new)

        def verified(index: int) -> int | None:
            if not 0 <= index < len(spans) or spans[index][0] < floor:
                return None
            seen = self._reply_visible(text, spans, index, reply)
            if seen is False or (seen is None and anchored != counted):
                return None
            boundary = spans[index][1] if finished else spans[index][0]
            return boundary if self._new_visible(text, spans, index, boundary, new) else None

        by_count = verified(counted)
        if by_count is not None:
            if anchored is None or anchored == counted:
                return by_count, "count"
            return "end-of-turn count and new-message anchors disagree on where our reply ends"
        if anchored is not None and counted - tolerance <= anchored < counted:
            by_anchor = verified(anchored)
            if by_anchor is not None:
                return by_anchor, "anchor"
        if counted >= len(spans):
            return None
        return "end of our previous reply could not be verified in the rendered request"

    # -- window -----------------------------------------------------------------------

    @staticmethod
    def _head_length(messages: Sequence[Message], head: str) -> int:
        n = 0
        while n < len(messages) and messages[n].role == "system":
            n += 1
        if head == "system+first user" and n < len(messages) and messages[n].role == "user":
            n += 1
        return n

    def _locate_in_window(
        self,
        seg: HeldSegment,
        messages: list[Message],
        tools: Sequence[Tool],
        kwargs: dict[str, Any],
        keys: Sequence[MessageKey],
        head: str,
        hashes: tuple[str, str],
        cache: dict[tuple[Any, ...], tuple[str, int]] | None = None,
    ) -> tuple[str, tuple[int, str]] | str:
        """(window text, (boundary, method)), or why the window cannot be used.

        The window is the head, our previous reply and the new messages. Its head
        rendered alone (cached per head messages, tools and kwargs) must be a prefix of
        the window; the marker closing our reply is then the one after the head's and the
        reply's own sampled markers, verified like the full render's.
        """
        held = len(seg.messages)
        n = self._head_length(messages, head)
        if n >= held - 1:
            return _WHOLE_CONVERSATION
        try:
            text = self.template.render(
                [*messages[:n], *messages[held - 1 :]], tools, add_generation_prompt=True, **kwargs
            )
        except TemplateRenderError as exc:
            return f"window render failed: {exc}"
        heads = self._heads if cache is None else cache
        key = (tuple(keys[:n]), *hashes)
        cached = heads.get(key)
        if cached is None or not text.startswith(cached[0]):
            try:
                head_text = self.template.render(
                    messages[:n], tools, add_generation_prompt=False, **kwargs
                )
            except TemplateRenderError as exc:
                return f"window head render failed: {exc}"
            if len(heads) >= _MAX_CACHED_HEADS:
                heads.pop(next(iter(heads)))
            cached = heads[key] = head_text, self._count_text_markers(head_text)
            if not text.startswith(head_text):
                return "the head rendered alone is not a prefix of the window"
        head_text, head_markers = cached
        finished = seg.reply_finished
        located = self._find_boundary(
            text,
            messages[held - 1],
            messages[held:],
            counted=head_markers + seg.reply_markers - int(finished),
            tolerance=seg.reply_markers - int(finished),
            finished=finished,
            floor=len(head_text),
        )
        if located is None:
            return f"{_NOT_FOUND} in the window"
        if isinstance(located, str):
            return f"{located} (window)"
        return text, located

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
            reply_markers=markers,
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
        seg.reply_markers = markers
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
        internal, finished, reply_markers = 0, False, 0
        for prompt_ids, output_ids, output_logprobs, eot in calls:
            if list(prompt_ids[: len(ids)]) != ids:
                raise ValueError("a call's prompt does not extend the segment's previous ids")
            new = list(prompt_ids[len(ids) :])
            ids += new + list(output_ids)
            mask += [0] * len(new) + [1] * len(output_ids)
            logprobs += [0.0] * len(new) + [float(x) for x in output_logprobs]
            finished = bool(eot and output_ids and output_ids[-1] in self._marker_ids)
            reply_markers = self.count_markers(output_ids)
            internal += reply_markers - int(finished)
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
            reply_markers=reply_markers,
            calls=len(calls),
            touched=next(self._clock),
        )

    # -- windowing probe --------------------------------------------------------------

    def windowing_for(
        self, template_kwargs: Mapping[str, Any], kwargs_hash: str | None = None
    ) -> WindowDecision:
        """The windowing decision for these template kwargs: probed once, then cached."""
        key = kwargs_hash or hash_template_kwargs(template_kwargs)
        decision = self._decisions.get(key)
        if decision is None:
            if len(self._decisions) >= _MAX_KWARGS_DECISIONS:
                return WindowDecision(False, None, "too many template kwargs sets to probe")
            decision = self._decisions[key] = self._decide(dict(template_kwargs))
        return decision

    def _decide(self, kwargs: dict[str, Any]) -> WindowDecision:
        if self._windowing_setting is False:
            return WindowDecision(False, None, "disabled by configuration")
        compared = 0
        try:
            steps = self._probe_steps(kwargs)
            failures = []
            for head in WINDOW_HEADS:
                problem, compared = self._probe_head(steps, head, kwargs)
                if problem is None:
                    return WindowDecision(
                        True,
                        head,
                        f"head '{head}': the window gave the full render's new text at all "
                        f"{compared} probe steps",
                        compared,
                    )
                failures.append(f"head '{head}': {problem}")
            reason = "; ".join(failures)
        except Exception as exc:  # a probe problem must only disable windowing
            reason = f"probe failed: {type(exc).__name__}: {exc}"
        if self._windowing_setting:
            return WindowDecision(True, WINDOW_HEADS[-1], f"forced on (probe: {reason})", compared)
        return WindowDecision(False, None, reason, compared)

    def _probe_steps(self, kwargs: dict[str, Any]) -> list[_ProbeStep]:
        """Drive the probe conversations through the full-render path, as `prepare` would.

        Each call after the first is a step: the held state (marker counts as the full
        path would hold them), the request, and the new text the full render gives (None
        when it would fork). A conversation stops where the template rejects it.
        """
        steps: list[_ProbeStep] = []
        for name, tools, turns in _probe_conversations():
            history: list[Message] = []
            seg: HeldSegment | None = None
            for index, turn in enumerate(turns):
                history = [*history, *turn.new]
                try:
                    text = self.template.render(
                        history, tools, add_generation_prompt=True, **kwargs
                    )
                except TemplateRenderError:
                    break
                prompt_markers, internal = self._count_text_markers(text), 0
                if seg is not None:
                    located = self._locate(seg, text, history)
                    full = text[located[0] :] if isinstance(located, tuple) else None
                    steps.append(_ProbeStep(f"{name}, call {index}", seg, history, tools, full))
                    if full is not None:
                        prompt_markers = seg.marker_count + self._count_text_markers(full)
                        internal = seg.internal_markers
                if turn.reply is None:
                    break
                sampled, finished = self._probe_sampled_markers(history, turn, tools, kwargs, text)
                seg = HeldSegment(
                    segment_id="probe",
                    parent_id=None,
                    messages=[*history, turn.reply],
                    message_keys=[],
                    tools_hash="",
                    kwargs_hash="",
                    ids=[],
                    mask=[],
                    logprobs=[],
                    prompt_length=0,
                    marker_count=prompt_markers + sampled,
                    internal_markers=internal + sampled - int(finished),
                    reply_finished=finished,
                    reply_markers=sampled,
                )
                history = [*history, turn.echo]
        return steps

    def _probe_sampled_markers(
        self,
        history: list[Message],
        turn: _ProbeTurn,
        tools: list[Tool],
        kwargs: dict[str, Any],
        prompt: str,
    ) -> tuple[int, bool]:
        """(markers the model would sample for the reply, whether it ends on one).

        The template's own rendering of the reply after the prompt, up to the first marker
        after the reply's last visible text (or that text, if the reply is cut); a plain
        reply and one stop marker when the template does not render replies that way.
        """
        assert turn.reply is not None
        finished = not turn.cut
        try:
            after = self.template.render(
                [*history, turn.reply], tools, add_generation_prompt=False, **kwargs
            )
        except TemplateRenderError:
            after = ""
        if after.startswith(prompt):
            tail = after[len(prompt) :]
            end = _last_anchor_end(tail, turn.reply)
            spans = [(m.start(), m.end()) for m in self._marker_re.finditer(tail)]
            inside = sum(1 for _, e in spans if e <= end)
            if end >= 0 and not finished:
                return inside, False
            if end >= 0 and any(s >= end for s, _ in spans):
                return inside + 1, True
        return int(finished), finished

    def _probe_head(
        self, steps: list[_ProbeStep], head: str, kwargs: dict[str, Any]
    ) -> tuple[str | None, int]:
        """(The first step where the window disagrees with the full render, or None;
        how many steps were compared). Steps whose window would be the whole conversation
        are skipped: `prepare` renders those fully."""
        cache: dict[tuple[Any, ...], tuple[str, int]] = {}
        compared = 0
        for step in steps:
            keys = [message_key(m) for m in step.messages]
            hashes = (hash_tools(step.tools), "")
            windowed = self._locate_in_window(
                step.seg, step.messages, step.tools, kwargs, keys, head, hashes, cache
            )
            if windowed == _WHOLE_CONVERSATION:
                continue
            compared += 1
            new = windowed[0][windowed[1][0] :] if isinstance(windowed, tuple) else None
            if new == step.full:
                continue
            if step.full is None:
                return f"{step.label}: the full render forks, the window extends", compared
            if new is None:
                return f"{step.label}: window not usable ({windowed})", compared
            return f"{step.label}: the window's new text differs from the full render's", compared
        return (None if compared else "no probe step could use a window"), compared


# -- windowing probe conversations ----------------------------------------------------

_WHOLE_CONVERSATION = "the window would be the whole conversation"


@dataclass(frozen=True)
class _ProbeTurn:
    new: list[Message]
    reply: Message | None
    """What "the engine" samples (None: the conversation ends with this request)."""
    echo: Message | None = None
    """How the client echoes the reply (default: exactly)."""
    cut: bool = False

    def __post_init__(self) -> None:
        if self.echo is None and self.reply is not None:
            object.__setattr__(self, "echo", self.reply)


@dataclass(frozen=True)
class _ProbeStep:
    label: str
    seg: HeldSegment
    messages: list[Message]
    tools: list[Tool]
    full: str | None
    """The new text the full render gives (None: the full path forks)."""


_PROBE_TOOL = Tool(
    name="probe_search",
    description="Search for a term.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}},
)


def _probe_conversations() -> list[tuple[str, list[Tool], list[_ProbeTurn]]]:
    """Conversations that exercise what templates render context-dependently: reasoning
    kept or dropped around user queries, tool-result grouping, injected default system
    prompts, tools with and without a system prompt, a cut reply, a later system message.

    Tool-call ids are 9 alphanumerics (Mistral templates reject others); parallel calls
    have their own conversation (Llama 3.x templates reject them, ending only that one).
    """

    def call(n: int) -> ToolCall:
        return ToolCall(
            id=f"prb{n:06d}", name=_PROBE_TOOL.name, arguments=json.dumps({"query": f"term {n}"})
        )

    def calls(reasoning: str | None, *ns: int, content: str = "") -> Message:
        return Message(
            role="assistant",
            content=content,
            reasoning=reasoning,
            tool_calls=[call(n) for n in ns],
        )

    def answer(text: str, reasoning: str | None = None) -> Message:
        return Message(role="assistant", content=text, reasoning=reasoning)

    def result(n: int) -> Message:
        return Message(role="tool", content=f"result for term {n}", tool_call_id=f"prb{n:06d}")

    def user(text: str) -> Message:
        return Message(role="user", content=text)

    def unreasoned(message: Message) -> Message:
        return message.model_copy(update={"reasoning": None})

    system = Message(role="system", content="You are a probing assistant.")
    tools = [_PROBE_TOOL]
    loop = [
        _ProbeTurn([system, user("Look up two terms.")], calls("First term first.", 1)),
        _ProbeTurn([result(1)], step := calls("Now the second.", 2), unreasoned(step)),
        _ProbeTurn([result(2)], answer("Both terms found.", "Summarise them.")),
        _ProbeTurn([user("A follow-up: look up one more.")], calls("Once more.", 3)),
        _ProbeTurn([result(3)], answer("The third term is known too.")),
        _ProbeTurn([user("Tell me more.")], answer("A long answer that got", "Plan."), cut=True),
        _ProbeTurn(
            [user("Shorter, please.")], step := answer("Short.", "Brief."), unreasoned(step)
        ),
        _ProbeTurn([user("Bye.")], None),
    ]
    parallel = [
        _ProbeTurn([system, user("Look up two terms at once.")], calls("Both at once.", 11, 12)),
        _ProbeTurn([result(11), result(12)], calls(None, 13, content="One more lookup.")),
        _ProbeTurn([result(13)], answer("All three found.", "Done.")),
        _ProbeTurn([user("Thanks.")], None),
    ]
    no_system = [
        _ProbeTurn([user("Look up a term.")], calls("Looking.", 21)),
        _ProbeTurn([result(21)], step := answer("Found it.", "Report."), unreasoned(step)),
        _ProbeTurn([user("Anything else?")], answer("Nothing else.")),
        _ProbeTurn([user("Ok.")], None),
    ]
    chat = [
        _ProbeTurn([user("Hello there.")], answer("Hello.")),
        _ProbeTurn([user("How are you?")], answer("Fine, thanks.", "Be polite.")),
        _ProbeTurn([user("Good.")], None),
    ]
    chat_with_system = [
        _ProbeTurn([system, user("Hi.")], step := answer("Hi!", "Greet."), unreasoned(step)),
        _ProbeTurn([user("Still there?")], answer("Yes.")),
        _ProbeTurn([Message(role="system", content="Be brief."), user("Good.")], answer("Ok.")),
        _ProbeTurn([user("Bye.")], None),
    ]
    return [
        ("tool loop", tools, loop),
        ("parallel tool calls", tools, parallel),
        ("tools without system prompt", tools, no_system),
        ("chat", [], chat),
        ("chat with system prompt", [], chat_with_system),
    ]


def _last_anchor_end(text: str, message: Message) -> int:
    """Where the last of a message's anchors ends in `text` (-1 if one is missing)."""
    end = -1
    for forms in _anchors(message):
        hits = [(at, len(f)) for f in forms if (at := text.find(f)) >= 0]
        if not hits:
            return -1
        at, length = min(hits)
        end = max(end, at + length)
    return end
