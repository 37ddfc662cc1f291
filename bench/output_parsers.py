"""CPU of each family's output parser on a long reply: whole, and streamed in small chunks.

For every registered family the reply is written by the family's real chat template (see
`devstack.family_output`): reasoning and content of about `--words` words plus `--calls`
tool calls. Prints per family the whole-output parse time, the streamed time (the reply
fed in `--chunk`-character pieces, as the stream decodes it token by token) and the ratio
of the streamed time for a reply four times as long to this one: about 4 means the
stream's cost grows with the new text, 16 would mean it re-reads what it already saw.

Run: `python -m bench.output_parsers [--words 1500] [--calls 8] [--chunk 4]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from devstack.family_output import NotAContinuation, assistant_output
from devstack.real_templates import read_template, template_names, templates_dir
from gateway.canonical import Message, Tool, ToolCall
from gateway.parsers.base import OutputParser, ParseContext, alnum_call_id
from gateway.parsers.registry import parser_for_model, parser_names
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError

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
EOS = "<|eos|>"
"""The end-of-sentence token the templates are given; the parsers learn it as the Gateway
teaches them a model's own (`parser_for_model`)."""
WORDS = ("the", "agent", "reads", "the", "failing", "test", "and", "plans", "a", "fix")


def prose(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def reply_variants(words: int, calls: int, call_id: Callable[[int], str]) -> list[Message]:
    """Richest first: some templates refuse content next to reasoning with tool calls."""
    tool_calls = [
        ToolCall(
            id=call_id(i),
            name=TOOL.name,
            arguments=json.dumps({"path": f"src/m{i}.py", "line": i, "text": prose(words // 8)}),
        )
        for i in range(calls)
    ]
    half = prose(words // 2)
    # Last resort: one call, for templates that render no more per message (Llama).
    return [
        Message(role="assistant", reasoning=half, content=half, tool_calls=tool_calls),
        Message(role="assistant", reasoning=half, tool_calls=tool_calls),
        Message(role="assistant", content=half, tool_calls=tool_calls),
        Message(role="assistant", tool_calls=tool_calls),
        Message(role="assistant", reasoning=half, tool_calls=tool_calls[:1]),
        Message(role="assistant", tool_calls=tool_calls[:1]),
    ]


def family_reply(family: str, words: int, calls: int) -> str | None:
    """The family's text for a long reply with tool calls; None without a template of the
    family's name, or when its rendering of a reply does not continue its generation
    prompt (templates that drop the reasoning the prompt opened: QwQ, the R1 distills)."""
    if family not in template_names():
        return None
    template = ChatTemplate(read_template(family, templates_dir()), bos_token="", eos_token=EOS)
    history = [Message(role="user", content="Fix the failing test.")]
    kimi_ids = template.tool_names_via_ids
    ids = (
        (lambda i: f"functions.{TOOL.name}:{i}") if kimi_ids else (lambda i: alnum_call_id("b", i))
    )
    for reply in reply_variants(words, calls, ids):
        try:
            return assistant_output(template, history, reply, [TOOL])
        except (NotAContinuation, TemplateRenderError):
            continue
    return None


def timed(run: Callable[[], object], repeat: int) -> float:
    """Median seconds of `repeat` runs (thread CPU time)."""
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        run()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def streamed(parser: OutputParser, text: str, ctx: ParseContext, chunk: int) -> None:
    splitter = parser.splitter(ctx)
    if splitter is None:
        parser.parse(text, ctx)
        return
    for at in range(0, len(text), chunk):
        splitter.feed(text[at : at + chunk])
    parser.parse(text, ctx)  # the finish parses the whole output once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", type=int, default=1500, help="words of reasoning + content")
    ap.add_argument("--calls", type=int, default=8, help="tool calls in the reply")
    ap.add_argument("--chunk", type=int, default=4, help="characters per streamed piece")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    ctx = ParseContext("bench", tools={TOOL.name: TOOL.parameters})
    print(f"{'family':<26}{'chars':>8}{'calls':>7}{'whole ms':>10}{'stream ms':>11}{'4x/1x':>7}")
    for family in parser_names():
        text = family_reply(family, args.words, args.calls)
        longer = family_reply(family, args.words * 4, args.calls)
        if text is None or longer is None:
            why = (
                "no template of that name"
                if family not in template_names()
                else "its template drops the reasoning its prompt opens"
            )
            print(f"{family:<26}  (not measured: {why})")
            continue
        parser = parser_for_model("", [EOS], family=family)
        found = len(parser.parse(text, ctx).tool_calls)
        whole = timed(partial(parser.parse, text, ctx), args.repeat)
        stream = timed(partial(streamed, parser, text, ctx, args.chunk), args.repeat)
        stream_4x = timed(partial(streamed, parser, longer, ctx, args.chunk), args.repeat)
        print(
            f"{family:<26}{len(text):>8}{found:>7}{whole * 1e3:>10.2f}{stream * 1e3:>11.2f}"
            f"{stream_4x / stream:>7.1f}"
        )


if __name__ == "__main__":
    main()
