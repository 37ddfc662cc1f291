"""What a call answered, derived from its sampled ids alone: the same for a live call, a
retry answered from the record, and a session revived after a restart."""

from collections.abc import Sequence

from gateway.canonical import Message, ParsedOutput, Reply, Tool
from gateway.parsers.base import OutputParser, ParseContext
from gateway.prompt.incremental import IncrementalTokenizer
from schemas.trajectory import RecordedCall


def parse_output(
    incremental: IncrementalTokenizer,
    parser: OutputParser,
    call_id: str,
    prompt_ids: list[int],
    output_ids: list[int],
    tools: Sequence[Tool],
) -> ParsedOutput:
    """The agent's view of sampled ids (deterministic: tool-call ids derive from the call
    id; arguments are typed by the request's `tools`)."""
    opened = incremental.prompt_opens_reasoning(prompt_ids)
    ctx = ParseContext.of(call_id, opened, tools)
    return parser.parse(incremental.tokenizer.decode(output_ids), ctx)


def reply_message(parsed: ParsedOutput) -> Message:
    """Our reply as the held segment keeps it (reasoning included)."""
    return Message(
        role="assistant",
        content=parsed.content,
        reasoning=parsed.reasoning,
        tool_calls=parsed.tool_calls,
    )


def turn_finished(finish_reason: str | None) -> bool:
    """Did the engine stop on its own (not cut at `max_tokens`)?"""
    return finish_reason != "length"


def reply_of(
    call: RecordedCall, parsed: ParsedOutput, model: str, prompt_tokens: int | None = None
) -> Reply:
    """The reply protocols render for a recorded ok call (`prompt_tokens`: the prompt's
    length, when `call.prompt_ids` holds only its tail)."""
    prompt = len(call.prompt_ids) if prompt_tokens is None else prompt_tokens
    finish = "stop" if turn_finished(call.finish_reason) else "length"
    return Reply(
        call_id=call.call_id,
        model=model,
        created=int(call.started_at.timestamp()),
        output=parsed,
        finish_reason="tool_calls" if parsed.tool_calls and finish == "stop" else finish,
        prompt_tokens=prompt,
        completion_tokens=len(call.output_ids),
        cached_prompt_tokens=prompt - call.new_prompt_tokens,
        output_ids=call.output_ids,
        output_logprobs=call.output_logprobs,
    )
