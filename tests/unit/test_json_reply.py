"""The finished-call replies written by orjson (`protocols.json_reply`) are byte for byte
what Starlette's `JSONResponse` wrote before, in every protocol."""

from __future__ import annotations

import json

import orjson
import pytest
from starlette.responses import JSONResponse, Response

from gateway.canonical import ParsedOutput, Reply, ToolCall
from gateway.protocols.anthropic_messages.reply import messages_body, messages_response
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.openai_chat.reply import chat_completion_body, chat_completion_response
from gateway.protocols.openai_responses.reply import responses_body, responses_response

SEAL = TokenSeal(b"k" * 32)

#: Text a JSON encoder can spell differently: non-ASCII, escapes, control characters,
#: separators and line breaks JavaScript treats specially.
AWKWARD = 'né 中文 😀 "q" \\ / \n\t\r\b\f \x00\x1f\x7f \u2028\u2029 </script>'


def result(arguments: str) -> Reply:
    return Reply(
        call_id="abc123",
        model="tiny-model",
        created=1_700_000_000,
        output=ParsedOutput(
            reasoning=AWKWARD,
            content=AWKWARD,
            tool_calls=[ToolCall(id="call_abc123_0", name="bash", arguments=arguments)],
        ),
        finish_reason="tool_calls",
        prompt_tokens=2**40,
        completion_tokens=7,
        cached_prompt_tokens=3,
        output_ids=[1, 2, 3],
        output_logprobs=[-0.1, -0.2, -0.3],
    )


ARGUMENTS = json.dumps({"command": AWKWARD, "n": 3, "ok": True, "none": None}, ensure_ascii=False)


def replies(arguments: str) -> list[tuple[Response, JSONResponse]]:
    """Each protocol's reply next to `JSONResponse` of the same body."""
    done = result(arguments)
    return [
        (chat_completion_response(done, stream=False), JSONResponse(chat_completion_body(done))),
        (responses_response(done, SEAL, stream=False), JSONResponse(responses_body(done, SEAL))),
        (messages_response(done, SEAL, stream=False), JSONResponse(messages_body(done, SEAL))),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["chat", "responses", "messages"])
def test_a_reply_is_the_bytes_and_headers_json_response_wrote(index: int) -> None:
    reply, stdlib = replies(ARGUMENTS)[index]
    assert not isinstance(reply, JSONResponse), "written by orjson"
    assert reply.body == stdlib.body
    assert reply.raw_headers == stdlib.raw_headers
    assert reply.status_code == stdlib.status_code == 200


def test_a_tool_input_with_floats_is_written_as_the_stdlib_spells_them() -> None:
    arguments = json.dumps({"timeout": 1e-05, "ratio": 0.5})
    reply, stdlib = replies(arguments)[2]
    assert isinstance(reply, JSONResponse)
    assert b'"timeout":1e-05' in reply.body
    assert reply.body == stdlib.body
    # Control: orjson spells the same float otherwise, so these bodies must not take it.
    assert orjson.dumps(messages_body(result(arguments), SEAL)) != stdlib.body
