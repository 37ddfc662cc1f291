"""A model family's own output text, produced by its real chat template: what the model
writes for an assistant message is what the template renders for that message after the
generation prompt. Tests, benchmarks and the scripted engine use it to speak each
family's format without a hand-written copy of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.canonical import Message, Tool
from gateway.prompt.chat_template import ChatTemplate


class NotAContinuation(ValueError):
    """The template renders the conversation with the reply differently from the prompt
    without it, so the reply's text cannot be cut out of the rendering."""


def assistant_output(
    template: ChatTemplate,
    history: Sequence[Message],
    reply: Message,
    tools: Sequence[Tool] = (),
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text a model of this template's family samples for `reply` after `history`
    (end-of-turn marker included, as the template closes the turn)."""
    kwargs = dict(template_kwargs or {})
    prompt = template.render(history, tools, add_generation_prompt=True, **kwargs)
    full = template.render([*history, reply], tools, add_generation_prompt=False, **kwargs)
    if not full.startswith(prompt):
        at = next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), None)
        at = min(len(prompt), len(full)) if at is None else at
        raise NotAContinuation(
            f"the rendering with the reply differs from the prompt at character {at}: "
            f"prompt {prompt[at : at + 40]!r}, with reply {full[at : at + 40]!r}"
        )
    return full[len(prompt) :]
