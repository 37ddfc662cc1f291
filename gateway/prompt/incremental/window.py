"""Windowed rendering: find the new text by rendering only part of the conversation.

On an extension only the text after our previous reply is new, so it is enough to render
a window: the conversation's head (its leading system messages, and for some templates
also the first user message, where tools, system prompts and injected defaults are
rendered), then our previous reply and the new messages. Per call this costs in
proportion to the new messages, not to the conversation. Whether a template renders the
new part of a window exactly as in the full render is decided by `window_probe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.canonical import Message, Tool
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental.boundary import NOT_FOUND, Located, find_boundary
from gateway.prompt.incremental.held_segments import HeldSegment
from gateway.prompt.incremental.markers import EndOfTurnMarkers
from gateway.prompt.incremental.message_keys import MessageKey

__all__ = ["WHOLE_CONVERSATION", "WINDOW_HEADS", "WindowRenderer", "head_length"]

WINDOW_HEADS: tuple[str, ...] = ("system", "system+first user")
"""Window heads, in the order the probe tries them: the leading system messages, or those
plus the first user message (templates that put tools into the first user turn, or that
need a user query in the conversation, e.g. Llama 3.1, Qwen3.5)."""

WHOLE_CONVERSATION = "the window would be the whole conversation"

_MAX_CACHED_HEADS = 64


def head_length(messages: Sequence[Message], head: str) -> int:
    """How many leading messages form the window head `head` (one of `WINDOW_HEADS`)."""
    n = 0
    while n < len(messages) and messages[n].role == "system":
        n += 1
    if head == "system+first user" and n < len(messages) and messages[n].role == "user":
        n += 1
    return n


class WindowRenderer:
    """Renders windows of one template and locates our previous reply's end in them.

    `heads` caches each head rendered alone with its markers (spans), keyed by the head's
    message keys, the tools and kwargs hashes and whether system messages fold (at most
    64, oldest dropped first).
    """

    def __init__(self, template: ChatTemplate, markers: EndOfTurnMarkers) -> None:
        self.template = template
        self.markers = markers
        self.heads: dict[tuple[Any, ...], tuple[str, list[tuple[int, int]]]] = {}

    def locate(
        self,
        seg: HeldSegment,
        messages: list[Message],
        tools: Sequence[Tool],
        kwargs: dict[str, Any],
        keys: Sequence[MessageKey],
        head: str,
        hashes: tuple[str, str],
    ) -> tuple[str, Located] | str:
        """(window text, (boundary, method)), or why the window cannot be used.

        The window is the head, our previous reply and the new messages. Its head
        rendered alone (cached per head messages, tools and kwargs) must be a prefix of
        the window; the marker closing our reply is then the one after the head's and the
        reply's own sampled markers, verified like the full render's.
        """
        held = len(seg.messages)
        n = head_length(messages, head)
        if n >= held - 1:
            return WHOLE_CONVERSATION
        # A developer message in the held middle decides how the window's system messages
        # render, though the window does not hold it.
        fold = self.template.folds_system_messages(messages)
        try:
            text = self.template.render_with_fold(
                [*messages[:n], *messages[held - 1 :]], tools, True, fold, kwargs
            )
        except TemplateRenderError as exc:
            return f"window render failed: {exc}"
        key = (tuple(keys[:n]), *hashes, fold)
        cached = self.heads.get(key)
        if cached is None or not text.startswith(cached[0]):
            try:
                head_text = self.template.render_with_fold(messages[:n], tools, False, fold, kwargs)
            except TemplateRenderError as exc:
                return f"window head render failed: {exc}"
            if len(self.heads) >= _MAX_CACHED_HEADS:
                self.heads.pop(next(iter(self.heads)))
            cached = self.heads[key] = head_text, self.markers.spans(head_text)
            if not text.startswith(head_text):
                return "the head rendered alone is not a prefix of the window"
        head_text, head_spans = cached
        finished = seg.reply_finished
        located = find_boundary(
            self.markers,
            text,
            messages[held - 1],
            messages[held:],
            counted=len(head_spans) + seg.reply_markers - int(finished),
            tolerance=seg.reply_markers - int(finished),
            finished=finished,
            floor=len(head_text),
            reply_markers=seg.reply_markers - int(finished),
            prefix_spans=head_spans,
        )
        if located is None:
            return f"{NOT_FOUND} in the window"
        if isinstance(located, str):
            return f"{located} (window)"
        return text, located
