"""Official SDK clients whose requests go to an in-process handler instead of the network.

The adapter tests let the real SDKs parse our replies. `openai` runs on httpx and
`anthropic` (2.x) on httpx2, so each gets its own mock transport; retries are off so an
error reply surfaces on the first call.
"""

from __future__ import annotations

from collections.abc import Callable

import anthropic
import httpx
import httpx2
import openai


def openai_client(
    handler: Callable[[httpx.Request], httpx.Response], api_key: str = "k"
) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=api_key,
        base_url="http://gateway/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        max_retries=0,
    )


def anthropic_client(
    handler: Callable[[httpx2.Request], httpx2.Response], api_key: str = "k"
) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=api_key,
        base_url="http://gateway",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
