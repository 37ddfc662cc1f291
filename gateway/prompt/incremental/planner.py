"""The planner: which ids to send for a request, and what the engine's reply adds.

Each call is planned against the session's held segments as clean (the request extends a
held conversation exactly), realign (it extends one after normalisers forgave how the
client echoed it) or fork (a fresh segment tokenized from scratch). On an extension the
held ids are reused verbatim and only the text after our previous reply is tokenized.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.canonical import Message, Tool
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.incremental.boundary import Located, locate_boundary
from gateway.prompt.incremental.held_segments import (
    HeldSegment,
    Segments,
    add_segment,
    new_segment_id,
)
from gateway.prompt.incremental.markers import EndOfTurnMarkers
from gateway.prompt.incremental.matching import Match, find_match, request_keys
from gateway.prompt.incremental.message_keys import (
    MessageKey,
    hash_template_kwargs,
    hash_tools,
    message_key,
)
from gateway.prompt.incremental.normalisers import DEFAULT_NORMALISERS, Normaliser
from gateway.prompt.incremental.tokenizer_adapter import Tokenizer
from gateway.prompt.incremental.window import WHOLE_CONVERSATION, WindowRenderer
from gateway.prompt.incremental.window_probe import WindowDecision, WindowProbe
from gateway.prompt.tool_dicts import RecentTexts, ToolList
from schemas.trajectory import MatchKind

__all__ = ["IncrementalTokenizer", "PromptPlan"]


@dataclass(eq=False)
class PromptPlan:
    """What to send for one call, and how it relates to the held tokens.

    For clean/realign, `prompt_ids[:base_length]` equals the held ids and the rest is the
    newly tokenized text (`new_text`). For fork, everything is new (`base_length` 0).
    `drift` names what normalisers forgave (realign) and, after a reply cut at
    `max_tokens`, the end-of-turn marker the template added to close it.
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


class IncrementalTokenizer:
    """Plans prompts against held segments and commits the engine's output to them.

    `eot_token` is the end-of-turn marker (or several, e.g. gpt-oss `<|end|>`, `<|call|>`,
    `<|return|>`): what the engine stops on and the template closes assistant turns with.
    Default: the template's EOS. Each must encode to a single token. `reasoning_tags`
    are only used by `prompt_opens_reasoning`. Not thread-safe: call `prepare`/`commit`
    from one event loop (they never await).

    `windowing`: None (default) lets the window probe decide whether extensions render
    only a window; False always renders the whole conversation; True forces windowing on
    (tests, benchmarks), with the head the probe accepted or else the largest one. The
    decision for no template kwargs is `self.windowing`; other kwargs sets are probed on
    first use (`windowing_for`).
    """

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        *,
        eot_token: str | Sequence[str] | None = None,
        reasoning_tags: tuple[str, str] | None = ("<think>", "</think>"),
        normalisers: Sequence[Normaliser] = DEFAULT_NORMALISERS,
        new_segment_id: Callable[[], str] = new_segment_id,
        windowing: bool | None = None,
    ) -> None:
        self.template = template
        self.tokenizer = tokenizer
        markers = eot_token or template.eos_token
        self.end_of_turn = (markers,) if isinstance(markers, str) else tuple(markers)
        self.reasoning_tags = reasoning_tags
        self.normalisers = tuple(normalisers)
        self._new_id = new_segment_id
        self._markers = EndOfTurnMarkers(self.end_of_turn, tokenizer)
        self._clock = itertools.count(1)
        self._window = WindowRenderer(template, self._markers)
        self._probe = WindowProbe(template, self._markers, windowing)
        self.windowing = self.windowing_for({})
        self._tools_hashes: RecentTexts[str] = RecentTexts(16)

    def count_markers(self, ids: Iterable[int]) -> int:
        return self._markers.count_ids(ids)

    def windowing_for(
        self, template_kwargs: Mapping[str, Any], kwargs_hash: str | None = None
    ) -> WindowDecision:
        """The windowing decision for these template kwargs: probed once, then cached."""
        return self._probe.decision_for(template_kwargs, kwargs_hash)

    def prompt_opens_reasoning(self, prompt_ids: Sequence[int], window: int = 64) -> bool:
        """Does the prompt end inside an opened reasoning block (generation prompt `<think>`)?

        Looks only at the tail after the last end-of-turn marker (at most `window` ids),
        so the cost does not grow with the conversation.
        """
        if self.reasoning_tags is None:
            return False
        tail: list[int] = []
        for token in reversed(prompt_ids[-window:]):
            if token in self._markers.ids:
                break
            tail.append(token)
        text = self.tokenizer.decode(tail[::-1])
        opened, closed = (text.rfind(tag) for tag in self.reasoning_tags)
        return opened > closed

    def _hash_tools(self, tools: ToolList) -> str:
        """`hash_tools`, remembered for the last tool lists: agents send the same ones on
        every call. Equal `tools_text`s are equal fields, which `hash_tools` hashes alike
        (NaN and null too: its orjson writes both as null)."""
        text = tools.text
        if text is None:
            return hash_tools(tools)
        known = self._tools_hashes.get(text)
        if known is None:
            known = hash_tools(tools)
            self._tools_hashes.put(text, known)
        return known

    # -- prepare ----------------------------------------------------------------------

    def prepare(
        self,
        segments: Iterable[HeldSegment] | Mapping[str, HeldSegment],
        messages: Sequence[Message],
        tools: Sequence[Tool] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> PromptPlan:
        """Plan the prompt ids for a request; raises `TemplateRenderError` on bad input.

        An extension renders only a window when this template's probe allowed it;
        anything that does not verify there is planned from the full render, exactly as
        without windowing.
        """
        segments = list(segments.values() if isinstance(segments, Mapping) else segments)
        messages = list(messages)
        tools = ToolList(tools)
        kwargs = dict(template_kwargs or {})
        keys = request_keys(messages, segments)
        tools_hash, kwargs_hash = self._hash_tools(tools), hash_template_kwargs(kwargs)
        match = find_match(segments, messages, keys, tools_hash, kwargs_hash, self.normalisers)
        common = dict(
            messages=messages, message_keys=keys, tools_hash=tools_hash, kwargs_hash=kwargs_hash
        )
        fallback: str | None = None
        if match.segment is not None:
            decision = self.windowing_for(kwargs, kwargs_hash)
            if decision.enabled and decision.head is not None:
                windowed = self._window.locate(
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
                fallback = None if windowed == WHOLE_CONVERSATION else windowed
        text = self.template.render(messages, tools, add_generation_prompt=True, **kwargs)
        if match.segment is not None:
            located_full = locate_boundary(self._markers, match.segment, text, messages)
            if isinstance(located_full, tuple):
                return self._extend(match, text, located_full, "full", fallback, **common)
            match.parent, match.reason = match.segment, located_full
        return self._fork(text, match, fallback, **common)

    def _extend(
        self,
        match: Match,
        text: str,
        located: Located,
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
        drift = match.drift
        if not seg.reply_finished:
            drift = [*drift, self._cut_note(len(seg.messages) - 1, new_text)]
        return PromptPlan(
            kind=MatchKind.realign if match.drift else MatchKind.clean,
            segment_id=seg.segment_id,
            parent_id=seg.parent_id,
            prompt_ids=seg.ids + new_ids,
            new_token_count=len(new_ids),
            drift=drift,
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

    def _cut_note(self, index: int, new_text: str) -> str:
        """The drift note of an extension past a reply cut at `max_tokens`.

        The cut reply has no end-of-turn marker of its own: the new text starts with the
        one the template closes the turn with, a prompt token (mask 0, never trained),
        and the sampled tokens stay as they are. The call remains an extension (clean,
        or realign when the echo drifted too); the note says what was added.
        """
        spans = self._markers.spans(new_text)
        closing = new_text[: spans[0][1]] if spans else ""
        return (
            f"message {index} (assistant): cut at max_tokens, closed with {closing!r} "
            "(prompt tokens, not trained)"
        )

    def _fork(self, text: str, match: Match, fallback: str | None, **common: Any) -> PromptPlan:
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
        finished = self._markers.closes_turn(output_ids, finished_with_eot)
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
        add_segment(segments, created)
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

    def restore(
        self,
        segments: MutableMapping[str, HeldSegment],
        *,
        segment_id: str,
        parent_id: str | None,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        output_logprobs: Sequence[float],
        reply: Message,
        finished_with_eot: bool,
        messages: Sequence[Message],
        tools_hash: str,
        kwargs_hash: str,
        message_keys: Sequence[MessageKey] | None = None,
        prompt_internal_markers: int = 0,
    ) -> HeldSegment:
        """Apply one recorded call to the held segments after a restart; returns its segment.

        Goes through `commit`, so replaying a session's calls in order rebuilds its segments
        exactly as the live process held them. The call extends `segment_id` if that is
        held (its prompt must start with the held ids, else `ValueError`), or else opens
        it. `messages` are the call's request messages (`message_keys` theirs, if known;
        `tools_hash`, `kwargs_hash` from `hash_tools`, `hash_template_kwargs`);
        `prompt_internal_markers` are the internal markers in an opening prompt that
        reuses another segment's ids (a concurrent call that lost its segment).
        """
        messages = list(messages)
        keys = list(message_keys) if message_keys is not None else list(map(message_key, messages))
        seg = segments.get(segment_id)
        common: dict[str, Any] = dict(
            segment_id=segment_id,
            prompt_ids=list(prompt_ids),
            drift=[],
            messages=messages,
            new_text="",
            tools_hash=tools_hash,
            kwargs_hash=kwargs_hash,
            message_keys=keys,
        )
        if seg is None:
            plan = PromptPlan(
                kind=MatchKind.fork,
                parent_id=parent_id,
                new_token_count=len(prompt_ids),
                base_length=0,
                prompt_markers=self.count_markers(prompt_ids),
                prompt_internal_markers=prompt_internal_markers,
                **common,
            )
        else:
            if list(prompt_ids[: len(seg.ids)]) != seg.ids:
                raise ValueError(f"a call's prompt does not extend segment {segment_id}")
            new_ids = prompt_ids[len(seg.ids) :]
            plan = PromptPlan(
                kind=MatchKind.clean,
                parent_id=seg.parent_id,
                new_token_count=len(new_ids),
                base_length=len(seg.ids),
                prompt_markers=seg.marker_count + self.count_markers(new_ids),
                prompt_internal_markers=seg.internal_markers,
                base_version=seg.version,
                segment=seg,
                **common,
            )
        return self.commit(segments, plan, output_ids, output_logprobs, reply, finished_with_eot)
