"""Per-call spans in /metrics: one call through the real Gateway over HTTP (official SDKs,
scripted engine: a fake LLM that follows a script) shows up in every span of its protocol,
and a failed call or a non-model request in none."""

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.spans import SPANS
from tests.fixtures.gateway import scripted_gateway

pytestmark = pytest.mark.integration

REPLY = "<think>\nNothing to do.\n</think>\n\nDone."


@pytest.fixture
def gw(tiny_model_dir: Path, gateway_factory: Any) -> Any:
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY) as (_, running):
        yield running


def span_counts(gw: Any, metric: str) -> dict[tuple[str, str], float]:
    """(protocol, span) → observations of `metric`, read from the control listener."""
    text = httpx.get(f"{gw.control_url}/metrics", headers=gw.admin_headers).text
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name == f"{metric}_count":
                counts[(sample.labels["protocol"], sample.labels["span"])] = sample.value
    return counts


def test_every_span_of_a_call_is_in_metrics_for_each_protocol(gw: Any) -> None:
    session = gw.create_session()
    oai = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi."}])
    oai.responses.create(model="m", input=[{"role": "user", "content": "Hi there."}], store=False)
    claude = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key=session["token"])
    claude.messages.create(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "Hello."}]
    )
    # not model calls: no spans
    oai.models.list()
    claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": "Hello."}])
    # a refused call: no spans either
    bad = httpx.post(
        f"{session['openai_base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {session['token']}"},
        json={"model": "m", "messages": []},
    )
    assert bad.status_code == 400

    expected = {
        (protocol, span): 1.0
        for protocol in ("openai_chat", "openai_responses", "anthropic_messages")
        for span in SPANS
    }
    assert span_counts(gw, "rollout_gateway_call_span_seconds") == expected
    assert span_counts(gw, "rollout_gateway_call_span_cpu_seconds") == expected
