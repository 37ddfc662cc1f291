"""Which requests are retries, and how a session's answers are found for them."""

import asyncio

from gateway.canonical import ParsedOutput, Reply
from gateway.capture.retries import RetryReplies, is_retry, request_digest


def result(call_id: str) -> Reply:
    return Reply(
        call_id=call_id,
        model="m",
        created=0,
        output=ParsedOutput(content="hi"),
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=1,
        output_ids=[1],
        output_logprobs=[0.0],
    )


def test_only_a_declared_retry_counts() -> None:
    assert is_retry({"X-Stainless-Retry-Count": "1"})
    assert is_retry({"x-stainless-retry-count": "3"})
    assert not is_retry({"x-stainless-retry-count": "0"})
    assert not is_retry({"x-stainless-retry-count": "one"})
    assert not is_retry({})


def test_the_digest_is_of_the_body_on_its_path() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    reordered = {"messages": body["messages"], "model": "m"}
    assert request_digest("/v1/chat/completions", body) == request_digest(
        "/v1/chat/completions", reordered
    )
    assert request_digest("/v1/chat/completions", body) != request_digest("/v1/responses", body)
    assert request_digest("/v1/chat/completions", body) != request_digest(
        "/v1/chat/completions", {**body, "temperature": 0.5}
    )
    # integers past 64 bits (which the fast encoder refuses) digest too, by value
    big = {**body, "seed": 2**70}
    assert request_digest("/v1/chat/completions", big) == request_digest(
        "/v1/chat/completions", dict(reversed(big.items()))
    )
    assert request_digest("/v1/chat/completions", big) != request_digest(
        "/v1/chat/completions", {**body, "seed": 2**70 + 1}
    )


def test_a_retry_waits_for_the_call_in_flight() -> None:
    async def scenario() -> None:
        answers = RetryReplies({"old": "c0"})
        assert await answers.reply_for("old") == "c0"
        assert await answers.reply_for("new") is None
        with answers.replying("new") as inflight:
            assert not inflight.awaited.is_set()
            waiter = asyncio.ensure_future(answers.reply_for("new"))
            await asyncio.sleep(0)
            assert not waiter.done()
            assert inflight.awaited.is_set(), "a streamed original now samples to the end"
            answers.recorded("new", "c1", 0)
            inflight.answer.set_result(result("c1"))
        assert (await waiter).call_id == "c1"  # type: ignore[union-attr]
        assert await answers.reply_for("new") == "c1"

        with answers.replying("failing"):
            waiter = asyncio.ensure_future(answers.reply_for("failing"))
            await asyncio.sleep(0)
        assert await waiter is None, "the original failed: the retry is sampled"

    asyncio.run(scenario())
