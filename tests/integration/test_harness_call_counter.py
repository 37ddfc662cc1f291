"""The harness' live LLM-call count (heartbeat details and `RunOutcome.llm_calls`) read
from a real Gateway's control API, scripted engine (a fake LLM that follows a script)."""

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from activities.harness import CallCounter
from tests.fixtures.gateway import scripted_gateway

pytestmark = pytest.mark.integration


def test_counts_the_session_calls_with_one_client_per_gateway(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    with scripted_gateway(gateway_factory, tiny_model_dir, "Done.") as (_, gw):
        assert gw.admin_token
        session = gw.create_session()
        oai = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
        for text in ("Hi.", "Again."):
            oai.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])

        async def counts() -> tuple[list[int | None], int]:
            counter = CallCounter(gw.admin_token, every_s=5.0)
            found = [
                await counter.count(gw.control_url, session["session_id"]),
                await counter.count(gw.control_url + "/", session["session_id"]),
                await counter.count(gw.control_url, "no-such-session"),
            ]
            clients = len(counter.clients)
            await counter.aclose()
            wrong_token = CallCounter("not-the-token", every_s=5.0)
            found.append(await wrong_token.count(gw.control_url, session["session_id"]))
            await wrong_token.aclose()
            off = CallCounter(gw.admin_token, every_s=0)
            found.append(await off.count(gw.control_url, session["session_id"]))
            return found, clients

        found, clients = asyncio.run(counts())
    assert found == [2, 2, None, None, None]
    assert clients == 1
