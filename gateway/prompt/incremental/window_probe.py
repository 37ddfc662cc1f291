"""The window probe: does a template render the new part of a window as in the full render?

That is not assumed. Per set of template kwargs the probe drives the `probe_corpus`
conversations through the full-render path, as the planner would, and at every step
compares the new text found in the full render with the one found in a window. Windowing
is enabled with the first head in `WINDOW_HEADS` that agrees at every step; the decision
says which head was chosen, or why none was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.canonical import Message, Tool
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental.boundary import last_anchor_end, locate_boundary
from gateway.prompt.incremental.held_segments import HeldSegment
from gateway.prompt.incremental.markers import EndOfTurnMarkers
from gateway.prompt.incremental.message_keys import hash_template_kwargs, hash_tools, message_key
from gateway.prompt.incremental.probe_corpus import ProbeTurn, probe_conversations
from gateway.prompt.incremental.window import WHOLE_CONVERSATION, WINDOW_HEADS, WindowRenderer

__all__ = ["WindowDecision", "WindowProbe"]

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


@dataclass(frozen=True)
class _ProbeStep:
    label: str
    seg: HeldSegment
    messages: list[Message]
    tools: list[Tool]
    full: str | None
    """The new text the full render gives (None: the full path forks)."""


class WindowProbe:
    """Window decisions for one template, probed once per set of template kwargs.

    `setting`: None lets the probe decide; False disables windowing without probing;
    True forces it on, with the head the probe accepted or else the largest one.
    """

    def __init__(
        self, template: ChatTemplate, markers: EndOfTurnMarkers, setting: bool | None
    ) -> None:
        self.template = template
        self.markers = markers
        self.setting = setting
        self._decisions: dict[str, WindowDecision] = {}

    def decision_for(
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
        if self.setting is False:
            return WindowDecision(False, None, "disabled by configuration")
        compared = 0
        try:
            steps = self._steps(kwargs)
            failures = []
            for head in WINDOW_HEADS:
                problem, compared = self._compare_head(steps, head, kwargs)
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
        if self.setting:
            return WindowDecision(True, WINDOW_HEADS[-1], f"forced on (probe: {reason})", compared)
        return WindowDecision(False, None, reason, compared)

    def _steps(self, kwargs: dict[str, Any]) -> list[_ProbeStep]:
        """Drive the probe conversations through the full-render path, as `prepare` would.

        Each call after the first is a step: the held state (marker counts as the full
        path would hold them), the request, and the new text the full render gives (None
        when it would fork). A conversation stops where the template rejects it.
        """
        steps: list[_ProbeStep] = []
        for name, tools, turns in probe_conversations():
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
                prompt_markers, internal = self.markers.count_text(text), 0
                if seg is not None:
                    located = locate_boundary(self.markers, seg, text, history)
                    full = text[located[0] :] if isinstance(located, tuple) else None
                    steps.append(_ProbeStep(f"{name}, call {index}", seg, history, tools, full))
                    if full is not None:
                        prompt_markers = seg.marker_count + self.markers.count_text(full)
                        internal = seg.internal_markers
                if turn.reply is None:
                    break
                sampled, finished = self._sampled_markers(history, turn, tools, kwargs, text)
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

    def _sampled_markers(
        self,
        history: list[Message],
        turn: ProbeTurn,
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
            end = last_anchor_end(tail, turn.reply)
            spans = self.markers.spans(tail)
            inside = sum(1 for _, e in spans if e <= end)
            if end >= 0 and not finished:
                return inside, False
            if end >= 0 and any(s >= end for s, _ in spans):
                return inside + 1, True
        return int(finished), finished

    def _compare_head(
        self, steps: list[_ProbeStep], head: str, kwargs: dict[str, Any]
    ) -> tuple[str | None, int]:
        """(The first step where the window disagrees with the full render, or None;
        how many steps were compared). Steps whose window would be the whole conversation
        are skipped: `prepare` renders those fully."""
        renderer = WindowRenderer(self.template, self.markers)
        compared = 0
        for step in steps:
            keys = [message_key(m) for m in step.messages]
            hashes = (hash_tools(step.tools), "")
            windowed = renderer.locate(
                step.seg, step.messages, step.tools, kwargs, keys, head, hashes
            )
            if windowed == WHOLE_CONVERSATION:
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
