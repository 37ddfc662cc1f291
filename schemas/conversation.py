"""What the agent's protocol carried in one call, compactly: the messages the request
added past what its segment already held, the tools it offered (by name) and the reply
as parsed. A call stores only its delta, so a conversation of n calls costs O(n) to
keep, not O(n²); the calls of a segment in order rebuild the whole conversation.
"""

import json
from typing import Literal

from pydantic import Field, TypeAdapter

from schemas.base import StrictModel

#: Characters of one text field (content, reasoning, tool arguments) a record keeps; the
#: rest is cut and its length said (`clip_text`). The tokens keep everything.
CONVERSATION_TEXT_CHARS = 8_000


def clip_text(text: str | None, limit: int = CONVERSATION_TEXT_CHARS) -> str | None:
    """`text` cut to `limit` characters, ending with how many more there were."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}[… {len(text) - limit:,} more characters]"


class ConvToolCall(StrictModel):
    """A function call: its name and its arguments as JSON text (clipped)."""

    name: str
    arguments: str
    id: str = ""


class ConvMessage(StrictModel):
    """One message in protocol terms."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ConvToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class CallConversation(StrictModel):
    """One call's part of the conversation."""

    history: int = Field(ge=0, description="the request's messages its segment already held")
    messages: list[ConvMessage] = Field(
        default_factory=list, description="the request's messages past `history`"
    )
    tools: list[str] = Field(default_factory=list, description="the tools offered, by name")
    reply: ConvMessage | None = Field(
        default=None, description="the reply as parsed (None: the call sampled no reply)"
    )
    finish_reason: str | None = None


_CALLS = TypeAdapter(list[CallConversation | None])


def conversation_json(calls: list[CallConversation | None]) -> str:
    """The samples' `conversation` column: one entry per call (null: not recorded)."""
    return json.dumps(
        [c.model_dump(mode="json", exclude_defaults=True) if c else None for c in calls],
        ensure_ascii=False,
    )


def conversation_of(raw: str) -> list[CallConversation | None]:
    """The column read back (ValueError naming it when it is not one)."""
    try:
        return _CALLS.validate_json(raw or "[]")
    except ValueError as exc:
        raise ValueError(f"conversation: not a list of calls: {exc}") from exc
