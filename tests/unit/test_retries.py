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


def test_the_digest_is_of_the_body_bytes_on_its_path() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    chat = request_digest("/v1/chat/completions", body)
    assert chat == request_digest("/v1/chat/completions", bytes(body))
    assert chat != request_digest("/v1/responses", body)
    assert chat != request_digest("/v1/chat/completions", body.replace(b"hi", b"ho"))
    # the bytes, not the value: an SDK retry resends its bytes, so another spelling of
    # the same JSON is another request (sampled again, a true sample)
    reordered = b'{"messages":[{"role":"user","content":"hi"}],"model":"m"}'
    assert chat != request_digest("/v1/chat/completions", reordered)


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
