"""The real vLLM CPU server: the token-level behaviours the Gateway relies on.

These pin down what devstack/vllm_server.py documents, so an engine upgrade that changes
the response shape or the EOS/stop semantics fails here first.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from devstack.tiny_model import IM_END, render_chat
from devstack.vllm_server import VllmServer, VllmServerConfig, VllmServerError

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

TOOL_CALL_RE = (
    r"<think>\n[a-z ]{1,20}\n</think>\n\n<tool_call>\n"
    r'\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,8}"\}\}\n</tool_call>'
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Tokenizer) -> list[int]:
    text = render_chat(
        [{"role": "user", "content": "北京天气怎么样？"}], add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False).ids


def complete(server: VllmServer, prompt: list[int], **params: Any) -> dict[str, Any]:
    body = {
        "model": server.model,
        "prompt": prompt,
        "return_token_ids": True,
        "logprobs": 1,
        **params,
    }
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


def test_token_id_prompt_round_trip(vllm_server: VllmServer, prompt_ids: list[int]) -> None:
    choice = complete(vllm_server, prompt_ids, max_tokens=12, seed=1, ignore_eos=True)
    assert choice["prompt_token_ids"] == prompt_ids
    ids = choice["token_ids"]
    assert len(ids) == 12 and all(isinstance(i, int) for i in ids)
    logprobs = choice["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(ids) == len(logprobs["tokens"])
    assert all(lp <= 0.0 for lp in logprobs["token_logprobs"])
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None


def test_eos_is_last_output_id_but_not_in_text(
    vllm_server: VllmServer, prompt_ids: list[int], tokenizer: Tokenizer
) -> None:
    eos = tokenizer.token_to_id(IM_END)
    choice = complete(
        vllm_server,
        prompt_ids,
        max_tokens=8,
        min_tokens=2,
        logit_bias={str(eos): 100},
        skip_special_tokens=False,
    )
    assert len(choice["token_ids"]) == 3 and choice["token_ids"][-1] == eos
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert IM_END not in choice["text"]


def test_stop_token_ids_and_stop_strings(
    vllm_server: VllmServer, prompt_ids: list[int], tokenizer: Tokenizer
) -> None:
    (beijing,) = tokenizer.encode("北京").ids  # a merged CJK token in the tiny vocab
    bias = {str(beijing): 100}
    by_id = complete(
        vllm_server, prompt_ids, max_tokens=4, logit_bias=bias, stop_token_ids=[beijing]
    )
    assert by_id["token_ids"] == [beijing] and by_id["stop_reason"] == beijing
    by_str = complete(vllm_server, prompt_ids, max_tokens=4, logit_bias=bias, stop=["北京"])
    assert by_str["token_ids"] == [beijing] and by_str["stop_reason"] == "北京"
    assert by_str["text"] == ""
    kept = complete(
        vllm_server,
        prompt_ids,
        max_tokens=4,
        logit_bias=bias,
        stop=["北京"],
        include_stop_str_in_output=True,
    )
    assert kept["text"] == "北京"


def test_seed_makes_sampling_reproducible(vllm_server: VllmServer, prompt_ids: list[int]) -> None:
    params: dict[str, Any] = {"max_tokens": 16, "temperature": 1.0, "ignore_eos": True}
    first = complete(vllm_server, prompt_ids, seed=42, **params)["token_ids"]
    assert complete(vllm_server, prompt_ids, seed=42, **params)["token_ids"] == first
    assert complete(vllm_server, prompt_ids, seed=43, **params)["token_ids"] != first


def test_structured_regex_forces_a_tool_call(
    vllm_server: VllmServer, prompt_ids: list[int], tokenizer: Tokenizer
) -> None:
    eos = tokenizer.token_to_id(IM_END)
    for seed in range(3):
        choice = complete(
            vllm_server,
            prompt_ids,
            max_tokens=200,
            seed=seed,
            structured_outputs={"regex": TOOL_CALL_RE},
        )
        ids = choice["token_ids"]
        assert choice["finish_reason"] == "stop" and ids[-1] == eos
        assert len(choice["logprobs"]["token_logprobs"]) == len(ids)
        text = tokenizer.decode(ids[:-1], skip_special_tokens=False)
        assert re.fullmatch(TOOL_CALL_RE, text), text
        call = json.loads(text.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0])
        assert call["name"] == "get_weather" and set(call["arguments"]) == {"city"}


def test_structured_regex_over_cjk(
    vllm_server: VllmServer, prompt_ids: list[int], tokenizer: Tokenizer
) -> None:
    pattern = r"(北京|上海)(今天|明天)(晴天|下雨)。"
    choice = complete(
        vllm_server, prompt_ids, max_tokens=40, seed=5, structured_outputs={"regex": pattern}
    )
    assert choice["finish_reason"] == "stop"
    text = tokenizer.decode(choice["token_ids"][:-1])
    assert re.fullmatch(pattern, text) and choice["text"] == text


def test_startup_failure_reports_log_and_leaves_nothing(vllm_python: Path, tmp_path: Path) -> None:
    server = VllmServer(VllmServerConfig(model_dir=tmp_path / "missing-model", python=vllm_python))
    with pytest.raises(VllmServerError, match="exited with code") as info:
        server.start()
    assert "missing-model" in str(info.value)
    assert server.pid is None


def test_stop_leaves_no_process(tiny_model_dir: Path, vllm_python: Path) -> None:
    server = VllmServer(
        VllmServerConfig(
            model_dir=tiny_model_dir, python=vllm_python, extra_args=["--enforce-eager"]
        )
    )
    with server:
        pgid = server.pid
        assert pgid is not None
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
