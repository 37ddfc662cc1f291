"""The conversations the window probe drives through a template.

They exercise what templates render depending on context: reasoning kept or dropped
around user queries, tool-result grouping, injected default system prompts, tools with
and without a system prompt, a cut reply, a later system message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import probe_call_id

__all__ = ["PROBE_TOOL", "ProbeTurn", "probe_conversations"]


@dataclass(frozen=True)
class ProbeTurn:
    """One call of a probe conversation: the messages the client adds, then the reply."""

    new: list[Message]
    reply: Message | None
    """What "the engine" samples (None: the conversation ends with this request)."""
    echo: Message | None = None
    """How the client echoes the reply (default: exactly)."""
    cut: bool = False

    def __post_init__(self) -> None:
        if self.echo is None and self.reply is not None:
            object.__setattr__(self, "echo", self.reply)


PROBE_TOOL = Tool(
    name="probe_search",
    description="Search for a term.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}},
)


def probe_conversations() -> list[tuple[str, list[Tool], list[ProbeTurn]]]:
    """(name, tools, turns) of each probe conversation.

    Tool-call ids come from `probe_call_id` (templates reject other shapes); parallel
    calls have their own conversation (Llama 3.x templates reject them, ending only that
    one).
    """

    def call(n: int) -> ToolCall:
        return ToolCall(
            id=probe_call_id(n), name=PROBE_TOOL.name, arguments=json.dumps({"query": f"term {n}"})
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
        return Message(role="tool", content=f"result for term {n}", tool_call_id=probe_call_id(n))

    def user(text: str) -> Message:
        return Message(role="user", content=text)

    def unreasoned(message: Message) -> Message:
        return message.model_copy(update={"reasoning": None})

    system = Message(role="system", content="You are a probing assistant.")
    tools = [PROBE_TOOL]
    loop = [
        ProbeTurn([system, user("Look up two terms.")], calls("First term first.", 1)),
        ProbeTurn([result(1)], step := calls("Now the second.", 2), unreasoned(step)),
        ProbeTurn([result(2)], answer("Both terms found.", "Summarise them.")),
        ProbeTurn([user("A follow-up: look up one more.")], calls("Once more.", 3)),
        ProbeTurn([result(3)], answer("The third term is known too.")),
        ProbeTurn([user("Tell me more.")], answer("A long answer that got", "Plan."), cut=True),
        ProbeTurn([user("Shorter, please.")], step := answer("Short.", "Brief."), unreasoned(step)),
        ProbeTurn([user("Bye.")], None),
    ]
    parallel = [
        ProbeTurn([system, user("Look up two terms at once.")], calls("Both at once.", 11, 12)),
        ProbeTurn([result(11), result(12)], calls(None, 13, content="One more lookup.")),
        ProbeTurn([result(13)], answer("All three found.", "Done.")),
        ProbeTurn([user("Thanks.")], None),
    ]
    no_system = [
        ProbeTurn([user("Look up a term.")], calls("Looking.", 21)),
        ProbeTurn([result(21)], step := answer("Found it.", "Report."), unreasoned(step)),
        ProbeTurn([user("Anything else?")], answer("Nothing else.")),
        ProbeTurn([user("Ok.")], None),
    ]
    chat = [
        ProbeTurn([user("Hello there.")], answer("Hello.")),
        ProbeTurn([user("How are you?")], answer("Fine, thanks.", "Be polite.")),
        ProbeTurn([user("Good.")], None),
    ]
    chat_with_system = [
        ProbeTurn([system, user("Hi.")], step := answer("Hi!", "Greet."), unreasoned(step)),
        ProbeTurn([user("Still there?")], answer("Yes.")),
        ProbeTurn([Message(role="system", content="Be brief."), user("Good.")], answer("Ok.")),
        ProbeTurn([user("Bye.")], None),
    ]
    return [
        ("tool loop", tools, loop),
        ("parallel tool calls", tools, parallel),
        ("tools without system prompt", tools, no_system),
        ("chat", [], chat),
        ("chat with system prompt", [], chat_with_system),
    ]
