"""CPU of each family's output parser on a long reply with tool calls: whole, and streamed
token by token as the Gateway streams it.

For every registered family the bench writes a reply of about `--tokens` tokens (counted
with the family's tiny model tokenizer, `devstack.tiny_families`) holding reasoning,
content and `--calls` tool calls, in the family's own format. Where it can, the family's
real chat template writes it (`devstack.family_output`); the `source` column says where
the bench had to help:

- `template`: the family's template renders the whole reply;
- `template + reasoning`: the template drops the reasoning its own generation prompt
  opens (QwQ, the R1 distills), so the bench writes the reasoning and its closing tag and
  the template renders the rest;
- `template per call`: the template renders one call per message (Llama, gpt-oss), so
  each call is rendered on its own and the calls are joined the way the format continues
  (Llama: `;` after `<|python_tag|>`; gpt-oss: one `<|start|>assistant` message each);
- `qwen3 template`: hermes has no template of its own; Qwen3's writes the same format;
- `written`: pythonic (Llama 3.2's `[f(a=1), …]`) is written by the bench.

The reply is encoded with the tokenizer and streamed one token at a time through
`gateway.parsers.stream.OutputStream` (decoder and splitter, as the Gateway's stream relay
does), then parsed whole once, as the finished call is. Printed per family: tokens, the
tool calls the parse found, the whole parse, the stream, its decoding alone (the same work
for every family; the rest is the family's splitter), the stream per token, and the
stream's time for a reply four times as long divided by this one's: about 4 means the
stream's cost grows with the new text; 16 would mean it re-reads what it already saw.
Times are the fastest of `--repeat` runs in thread CPU time, so other jobs on the machine
inflate them less than they would wall time.

Run: `python -m bench.output_parsers [--tokens 2000] [--calls 8] [--repeat 7]`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from devstack.family_output import NotAContinuation, assistant_output
from devstack.tiny_families import ensure_family_model, family_names
from gateway.canonical import Message, Tool, ToolCall
from gateway.parsers.base import OutputParser, ParseContext, alnum_call_id
from gateway.parsers.registry import parser_names
from gateway.parsers.selection import parser_for_model
from gateway.parsers.stream import IncrementalDecoder, OutputStream
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental import Tokenizer, load_tokenizer
from gateway.prompt.model_files import ModelFiles, load_model_files

TOOL = Tool(
    name="edit_file",
    description="Replace a line of a file.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "text": {"type": "string"},
        },
    },
)
WORDS = ("the", "agent", "reads", "the", "failing", "test", "and", "plans", "a", "fix")
HISTORY = [Message(role="user", content="Fix the failing test.")]
SIBLING = {"hermes": "qwen3", "pythonic": "llama3.2"}
"""Families without a template (and tiny model) of their own → whose tokenizer they use."""
PER_CALL = {"llama3.1", "llama3.2", "gpt-oss"}
"""Templates that render one tool call per assistant message."""


def prose(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


@dataclass
class Family:
    """One family's model files, template, parser and tokenizer."""

    name: str
    files: ModelFiles
    template: ChatTemplate
    parser: OutputParser
    tokenizer: Tokenizer
    tool: Tool

    @classmethod
    def load(cls, name: str, tool: Tool = TOOL) -> Family:
        files = load_model_files(ensure_family_model(SIBLING.get(name, name)))
        template = ChatTemplate(
            files.chat_template, bos_token=files.bos_token or "", eos_token=files.eos_token
        )
        parser = parser_for_model(files.chat_template, files.end_of_turn, family=name)
        return cls(name, files, template, parser, load_tokenizer(files.tokenizer_path), tool)

    @property
    def source(self) -> str:
        if self.name == "pythonic":
            return "written"
        if self.name in SIBLING:
            return f"{SIBLING[self.name]} template"
        if self.name in PER_CALL:
            return "template per call"
        if self.reasoning_dropped:
            return "template + reasoning"
        return "template"

    @property
    def prompt(self) -> str:
        return self.template.render(HISTORY, [self.tool], add_generation_prompt=True)

    @property
    def reasoning_dropped(self) -> bool:
        """The generation prompt opens reasoning that the template's rendering of a reply
        leaves out (so a reply cannot be cut out of a rendering)."""
        reply = Message(role="assistant", reasoning="r", content="c")
        try:
            assistant_output(self.template, HISTORY, reply, [self.tool])
        except NotAContinuation:
            return self.parser.reasoning_tags is not None
        return False

    def context(self) -> ParseContext:
        """The Gateway's reading of the prompt: does its tail leave a reasoning block open?"""
        opened = False
        if self.parser.reasoning_tags is not None:
            tail = self.prompt
            for marker in self.files.end_of_turn:
                tail = tail.rsplit(marker, 1)[-1]
            start, end = self.parser.reasoning_tags
            opened = tail.rfind(start) > tail.rfind(end)
        tools = {self.tool.name: self.tool.parameters}
        return ParseContext("bench", starts_in_reasoning=opened, tools=tools)

    def call_id(self, index: int) -> str:
        if self.template.tool_names_via_ids:  # Kimi's ids name the function
            return f"functions.{self.tool.name}:{index}"
        return alnum_call_id("bench", index)  # 9 alphanumerics fit every template

    def reply(
        self, words: int, calls: int, arguments: Callable[[int, str], dict[str, object]]
    ) -> str | None:
        """The family's text for a reply of about `words` words and `calls` calls (the
        arguments of call i, given some prose); None when no way of writing it gives a
        parse with every call."""
        text = prose(words // (2 * calls)) if calls else ""
        tool_calls = [
            ToolCall(
                id=self.call_id(i), name=self.tool.name, arguments=json.dumps(arguments(i, text))
            )
            for i in range(calls)
        ]
        half = prose(words // 4 if tool_calls else words // 2)
        if self.name == "pythonic":
            candidates = [pythonic(half, tool_calls)]
        elif self.name in PER_CALL:
            candidates = [self.per_call(half, tool_calls)]
        else:
            # Richest first: some templates refuse or drop content next to reasoning and calls.
            candidates = [
                self.render(
                    Message(role="assistant", reasoning=r, content=c, tool_calls=tool_calls)
                )
                for r, c in ((half, half), (half + " " + half, None), (None, half + " " + half))
            ]
        for text in candidates:
            if text is None:
                continue
            parsed = self.parser.parse(text, self.context())
            if len(parsed.tool_calls) == calls and parsed.parse_error is None:
                return text
        return None

    def render(self, reply: Message) -> str | None:
        try:
            return assistant_output(self.template, HISTORY, reply, [self.tool])
        except TemplateRenderError:
            return None
        except NotAContinuation:
            if not self.reasoning_dropped or reply.reasoning is None:
                return None
        # The prompt ends inside an opened block: the model writes its reasoning and closes
        # the block; the template renders the reply without it from there on.
        assert self.parser.reasoning_tags is not None
        start, end = self.parser.reasoning_tags
        head = self.prompt.rstrip()
        if not head.endswith(start):
            return None
        head = head[: -len(start)]
        without = reply.model_copy(update={"reasoning": None})
        try:
            full = self.template.render(
                [*HISTORY, without], [self.tool], add_generation_prompt=False
            )
        except TemplateRenderError:
            return None
        if not full.startswith(head):
            return None
        return f"{reply.reasoning}\n{end}\n\n{full[len(head) :]}"

    def per_call(self, half: str, tool_calls: list[ToolCall]) -> str | None:
        """Each call rendered as the only call of its message, joined by the format."""
        pieces = []
        for i, call in enumerate(tool_calls):
            reasoning = half if i == 0 and self.name == "gpt-oss" else None
            text = self.render(Message(role="assistant", reasoning=reasoning, tool_calls=[call]))
            if text is None:
                return None
            pieces.append(text)
        if self.name == "gpt-oss":  # each further call is a message of its own
            return "<|start|>assistant".join(pieces)
        # Llama: content, then the calls after `<|python_tag|>`, joined by `;`
        calls = [p.removesuffix(m) for p in pieces for m in self.files.end_of_turn if p.endswith(m)]
        return f"{half} {half}<|python_tag|>{'; '.join(calls)}<|eom_id|>"

    def sized_reply(self, tokens: int, calls: int) -> tuple[str, list[int]] | None:
        """A reply within 2 % of `tokens` tokens (words scaled by what a render counted)."""
        words = tokens // 2
        best: tuple[str, list[int]] | None = None
        for _ in range(6):
            text = self.reply(words, calls, edit_arguments)
            if text is None:
                return None
            ids = self.tokenizer.encode(text)
            best = (text, ids)
            if abs(len(ids) - tokens) <= tokens * 0.02:
                break
            words = max(calls, round(words * tokens / len(ids)))
        return best


def edit_arguments(index: int, text: str) -> dict[str, object]:
    return {"path": f"src/m{index}.py", "line": index, "text": text}


def pythonic(content: str, tool_calls: list[ToolCall]) -> str:
    """Llama 3.2's pythonic calls after `<|python_tag|>`, written by the bench."""
    rendered = []
    for call in tool_calls:
        args = ", ".join(f"{k}={v!r}" for k, v in json.loads(call.arguments).items())
        rendered.append(f"{call.name}({args})")
    return f"{content} {content}<|python_tag|>[{', '.join(rendered)}]<|eom_id|>"


def fastest(runs: list[Callable[[], object]], repeat: int) -> list[float]:
    """Fastest of `repeat` runs of each, in seconds of thread CPU time; the runs take
    turns, so a load that comes and goes hits them alike."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for run, spent in zip(runs, times, strict=True):
            start = time.thread_time()
            run()
            spent.append(time.thread_time() - start)
    return [min(spent) for spent in times]


def decoded(tokenizer: Tokenizer, ids: list[int]) -> None:
    """The stream's decoding alone (no splitter): its share of the streamed time."""
    decoder = IncrementalDecoder(tokenizer)
    for token in ids:
        decoder.feed([token])


def streamed(family: Family, text: str, ids: list[int], ctx: ParseContext) -> None:
    """One streamed call: every sampled id through the decoder and splitter, then the
    whole parse of the finished call."""
    stream = OutputStream(family.tokenizer, family.parser, ctx)
    for token in ids:
        stream.feed([token])
    family.parser.parse(text, ctx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="tokens of the reply")
    ap.add_argument("--calls", type=int, default=8, help="tool calls in the reply")
    ap.add_argument("--repeat", type=int, default=7, help="runs per figure (fastest kept)")
    args = ap.parse_args()
    missing = sorted(set(parser_names()) - set(family_names()) - set(SIBLING))
    if missing:
        raise SystemExit(f"no tiny model or sibling for {missing}: add one to SIBLING")
    print(
        f"{'family':<26}{'source':<22}{'tokens':>7}{'calls':>6}{'whole ms':>10}"
        f"{'stream ms':>11}{'decode ms':>11}{'us/token':>10}{'4x/1x':>7}"
    )
    for name in parser_names():
        family = Family.load(name)
        ctx = family.context()
        reply = family.sized_reply(args.tokens, args.calls)
        longer = family.sized_reply(4 * args.tokens, args.calls)
        if reply is None or longer is None:
            print(f"{name:<26}(not measured: no reply of its format with every call parsed)")
            continue
        text, ids = reply
        if family.tokenizer.decode(ids) != text:
            raise SystemExit(f"{name}: the tokenizer does not round-trip the reply")
        found = len(family.parser.parse(text, ctx).tool_calls)
        whole, decode, stream, stream_4x = fastest(
            [
                partial(family.parser.parse, text, ctx),
                partial(decoded, family.tokenizer, ids),
                partial(streamed, family, text, ids, ctx),
                partial(streamed, family, *longer, ctx),
            ],
            args.repeat,
        )
        print(
            f"{name:<26}{family.source:<22}{len(ids):>7}{found:>6}{whole * 1e3:>10.2f}"
            f"{stream * 1e3:>11.2f}{decode * 1e3:>11.2f}{stream / len(ids) * 1e6:>10.1f}"
            f"{stream_4x / stream:>7.2f}"
        )


if __name__ == "__main__":
    main()
