"""The drift rules that let a client's echo of a held message count as that message."""

import pytest

from gateway.canonical import Message, ToolCall
from gateway.prompt.incremental.normalisers import DEFAULT_NORMALISERS, forgive

CALL = ToolCall(id="call_1", name="run", arguments='{"cmd": "ls", "cwd": "/"}')
HELD = Message(role="assistant", content="Listing.", reasoning="look first", tool_calls=[CALL])


def echo(**update: object) -> Message:
    return HELD.model_copy(update=update)


@pytest.mark.parametrize(
    ("echoed", "drift"),
    [
        (echo(reasoning=None), ["reasoning dropped by client"]),
        (echo(content="  Listing.\n"), ["surrounding whitespace"]),
        (
            echo(tool_calls=[CALL.model_copy(update={"arguments": '{"cwd":"/","cmd":"ls"}'})]),
            ["tool-call arguments re-serialised"],
        ),
        (
            echo(tool_calls=[CALL.model_copy(update={"id": "toolu_9"})]),
            ["tool-call ids rewritten"],
        ),
        (
            echo(
                reasoning=None,
                content="Listing. ",
                tool_calls=[
                    CALL.model_copy(update={"id": "x", "arguments": '{"cwd":"/","cmd":"ls"}'})
                ],
            ),
            [
                "reasoning dropped by client",
                "surrounding whitespace",
                "tool-call arguments re-serialised",
                "tool-call ids rewritten",
            ],
        ),
    ],
)
def test_each_kind_of_drift_is_named(echoed: Message, drift: list[str]) -> None:
    assert forgive(HELD, echoed, DEFAULT_NORMALISERS) == drift


@pytest.mark.parametrize(
    "echoed",
    [
        echo(content="Something else."),
        echo(role="user"),
        echo(tool_calls=[CALL.model_copy(update={"arguments": '{"cmd": "rm"}'})]),
        echo(tool_calls=[]),
    ],
)
def test_a_different_message_is_not_forgiven(echoed: Message) -> None:
    assert forgive(HELD, echoed, DEFAULT_NORMALISERS) is None


def test_content_none_and_empty_are_the_same_message() -> None:
    held = Message(role="assistant", content=None, tool_calls=[CALL])
    echoed = Message(role="assistant", content="", tool_calls=[CALL])
    assert forgive(held, echoed, DEFAULT_NORMALISERS) == ["content None vs empty"]


def test_a_rule_that_changes_nothing_hands_back_the_same_messages() -> None:
    """Every held reply is forgiven on every call; a rule with nothing to do must not copy."""
    plain = Message(role="assistant", content="done", reasoning="r")
    same = plain.model_copy()
    for rule in DEFAULT_NORMALISERS:
        held, echoed = rule.apply(plain, same)
        assert held is plain and echoed is same, rule.name
