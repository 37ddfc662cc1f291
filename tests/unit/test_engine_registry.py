"""The engine registry: every name `--engine-api` accepts builds its client, and the
built client talks to the endpoint that name stands for."""

from typing import get_args

from gateway.engines.registry import ENGINES, EngineName
from gateway.engines.sglang import SglangEngine
from gateway.engines.vllm import VllmEngine


def test_every_engine_name_has_a_client_and_every_client_a_name() -> None:
    assert sorted(ENGINES) == sorted(get_args(EngineName))


def test_each_name_builds_the_client_for_its_endpoint() -> None:
    built = {
        name: make("tiny", request_timeout_s=5.0, connect_retries=1)
        for name, make in ENGINES.items()
    }
    completions, generate, sglang = built["completions"], built["generate"], built["sglang"]
    assert type(completions) is VllmEngine and completions.api == "completions"
    assert type(generate) is VllmEngine and generate.api == "generate"
    assert type(sglang) is SglangEngine
    assert all(c.model == "tiny" and c.connect_retries == 1 for c in built.values())
