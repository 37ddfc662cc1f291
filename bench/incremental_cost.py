"""CPU per call of the incremental planner (`prepare` + `commit`) as a conversation grows.

Drives long tool-loop conversations with the tiny model's template and tokenizer through
`IncrementalTokenizer`, once rendering the whole conversation on every call (`full`) and
once rendering only a window (`window`, see `gateway.prompt.incremental`). Prints the mean
per-call CPU (thread time) at early and late turns, and how many messages each call
passed to the template. No engine: the "sampled" reply is the tokenized reply text.

Run: `python -m bench.incremental_cost [--turns 80] [--conversations 5] [--tools 15]`
(`--tools N`: `bench.conversations.tool_list(N)`, `run` and agent-sized tools, in place of
two small ones).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from bench.conversations import tool_list
from devstack.tiny_model import IM_END, chat_template_text, ensure_tiny_model
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.incremental import HeldSegment, IncrementalTokenizer, load_tokenizer

TOOLS = [
    Tool(
        name="run",
        description="Run a shell command in the sandbox.",
        parameters={"type": "object", "properties": {"cmd": {"type": "string"}}},
    ),
    Tool(
        name="read_file",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}},
    ),
]
SYSTEM = "You are a coding agent. Work in small steps and check every result. " * 4
TOOL_OUTPUT = "total 8\n-rw-r--r-- 1 root root 42 hello.py\n-rw-r--r-- 1 root root 17 notes.md\n"


class Recording(ChatTemplate):
    """Counts the messages passed to `render_with_fold` (every render goes there) per call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rendered: list[int] = []

    def render_with_fold(self, messages: Any, *args: Any) -> str:
        self.rendered.append(len(messages))
        return super().render_with_fold(messages, *args)


def reply_for(turn: int) -> tuple[Message, str]:
    """Turn `turn`'s reply and the text "the engine" sampled for it."""
    reasoning = f"Step {turn}: look at the files again."
    if turn % 10 == 9:
        content = f"Done with part {turn // 10}."
        return Message(role="assistant", content=content, reasoning=reasoning), (
            f"<think>\n{reasoning}\n</think>\n\n{content}{IM_END}"
        )
    args = json.dumps({"cmd": f"ls -la dir{turn}"})
    call = ToolCall(id=f"call_{turn}", name="run", arguments=args)
    body = f'{{"name": "run", "arguments": {args}}}'
    text = f"<think>\n{reasoning}\n</think>\n\n<tool_call>\n{body}\n</tool_call>{IM_END}"
    return Message(role="assistant", content="", reasoning=reasoning, tool_calls=[call]), text


def conversation(
    planner: IncrementalTokenizer, turns: int, tools: list[Tool]
) -> tuple[list[float], list[int]]:
    """Per call: CPU seconds of prepare + commit, and messages passed to the template."""
    template = planner.template
    assert isinstance(template, Recording)
    segments: list[HeldSegment] = []
    history = [Message(role="system", content=SYSTEM), Message(role="user", content="Fix it.")]
    cpu: list[float] = []
    rendered: list[int] = []
    for turn in range(turns):
        reply, text = reply_for(turn)
        sampled = planner.tokenizer.encode(text)
        template.rendered.clear()
        t0 = time.thread_time()
        plan = planner.prepare(segments, history, tools)
        planner.commit(segments, plan, sampled, [-0.1] * len(sampled), reply, True)
        cpu.append(time.thread_time() - t0)
        rendered.append(sum(template.rendered))
        echoed = reply.model_copy(update={"reasoning": None})  # clients drop reasoning
        if reply.tool_calls:
            result = Message(
                role="tool", content=f"{TOOL_OUTPUT}turn {turn}", tool_call_id=f"call_{turn}"
            )
            history = [*history, echoed, result]
        else:
            history = [*history, echoed, Message(role="user", content=f"Continue, part {turn}.")]
    assert len(segments) == 1, "the conversation must stay one segment"
    return cpu, rendered


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=80)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--tools", type=int, default=None, help="agent-sized tools instead")
    args = parser.parse_args()
    tools = TOOLS
    if args.tools is not None:
        functions = (tool["function"] for tool in tool_list(args.tools))
        tools = [Tool(**function) for function in functions]
    tokenizer = load_tokenizer(ensure_tiny_model() / "tokenizer.json")
    early, late = range(0, 5), range(args.turns - 5, args.turns)
    for windowing in (False, True):
        template = Recording(chat_template_text(), bos_token=None, eos_token=IM_END)
        planner = IncrementalTokenizer(template, tokenizer, windowing=windowing)
        runs = [conversation(planner, args.turns, tools) for _ in range(args.conversations)]
        per_turn = [statistics.median(cpu[t] for cpu, _ in runs) for t in range(args.turns)]
        messages = runs[0][1]
        print(
            f"{planner.windowing.mode:6s} turns {early.start + 1}-{early.stop}: "
            f"{1000 * statistics.mean(per_turn[t] for t in early):.2f} ms/call, "
            f"turns {late.start + 1}-{late.stop}: "
            f"{1000 * statistics.mean(per_turn[t] for t in late):.2f} ms/call; "
            f"messages rendered per call: {messages[early.start]}..{messages[early.stop - 1]}"
            f" early, {messages[late.start]}..{messages[late.stop - 1]} late"
        )


if __name__ == "__main__":
    main()
