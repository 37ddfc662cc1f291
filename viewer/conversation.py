"""A segment's conversation as the rollout page shows it, one page of calls at a time.

Each call shows what its protocol carried: the messages the request added past what the
segment held (system, user, tool results), then the reply as parsed (reasoning folded,
tool calls with name and arguments). Text is made safe here (`viewer.text.clip`: control
characters visible, long text clipped); HTML stays inert by the templates' autoescape.
"""

import json
from dataclasses import dataclass

from rollout_client.samples_reader import CallView, SegmentView
from schemas.conversation import ConvMessage
from viewer.text import clip

#: Calls one conversation page shows (a 200-call rollout opens page by page).
PAGE_CALLS = 20
#: Characters of one text field shown (records keep at most 8,000 of each).
TEXT_CHARS = 8_000


@dataclass
class ShownToolCall:
    name: str
    arguments: str
    id: str


@dataclass
class ShownMessage:
    role: str
    #: What the role is called in the page: a tool result names its call.
    label: str
    content: str | None
    reasoning: str | None
    tool_calls: list[ShownToolCall]


@dataclass
class ShownCall:
    index: int
    policy_version: str
    tokens: int
    history: int
    tools: list[str]
    messages: list[ShownMessage]
    reply: ShownMessage | None
    finish_reason: str | None


@dataclass
class ConversationPage:
    page: int
    pages: int
    total: int
    #: None: the samples record no conversation (an older schema or gateway).
    calls: list[ShownCall] | None


def conversation_page(seg: SegmentView, page: int) -> ConversationPage:
    """The calls of page `page` (clamped to the pages there are)."""
    total = len(seg.calls)
    pages = max(1, -(-total // PAGE_CALLS))
    page = min(max(page, 0), pages - 1)
    if all(c.conversation is None for c in seg.calls):
        return ConversationPage(page, pages, total, None)
    chosen = seg.calls[page * PAGE_CALLS : (page + 1) * PAGE_CALLS]
    return ConversationPage(page, pages, total, [_call(c) for c in chosen])


def _call(c: CallView) -> ShownCall:
    said = c.conversation
    return ShownCall(
        index=c.index,
        policy_version=c.policy_version,
        tokens=c.tokens,
        history=said.history if said else 0,
        tools=[clip(t, 200) for t in said.tools] if said else [],
        messages=[_message(m) for m in said.messages] if said else [],
        reply=_message(said.reply) if said and said.reply else None,
        finish_reason=said.finish_reason if said else None,
    )


def _message(m: ConvMessage) -> ShownMessage:
    label = m.role
    if m.role == "tool":
        label = "tool result" + (f" ({m.name})" if m.name else "")
        label += f" for {m.tool_call_id}" if m.tool_call_id else ""
    return ShownMessage(
        role=m.role,
        label=clip(label, 300),
        content=_text(m.content),
        reasoning=_text(m.reasoning),
        tool_calls=[
            ShownToolCall(
                clip(t.name, 200), _text(pretty_arguments(t.arguments)) or "", clip(t.id, 200)
            )
            for t in m.tool_calls
        ],
    )


def _text(text: str | None) -> str | None:
    return None if text is None else clip(text, TEXT_CHARS)


def pretty_arguments(arguments: str) -> str:
    """Tool-call arguments indented when they are JSON, else as the model wrote them."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments
