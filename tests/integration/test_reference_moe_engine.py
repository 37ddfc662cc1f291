"""The STAND-IN reference MoE engine speaks vLLM's token-in/token-out wire, routing
included, and an independent transformers forward agrees with the routing it returns."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from devstack.reference_moe import ReferenceMoeServer, RoutedSequence, recompute_routing
from gateway.engines.routed_experts import vllm_routing
from gateway.engines.vllm_wire import completion_reply, extract_completion, stream_merge
from tests.fixtures.reference_moe import moe_engine, moe_model_dir  # noqa: F401
from tests.fixtures.vllm import vllm_python  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

PROMPT = [11, 400, 27, 1300, 9, 88, 5, 702]
LAYERS, TOP_K = 3, 2


def decode(encoded: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def generate(engine: ReferenceMoeServer, **params: Any) -> dict[str, Any]:
    sampling = {"temperature": 1.0, "seed": 7, "max_tokens": 12, "logprobs": 2, **params}
    body = {"model": engine.model, "token_ids": PROMPT, "sampling_params": sampling}
    reply = httpx.post(f"{engine.url}/inference/v1/generate", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_reply_is_vllm_generate_shape_with_routing_of_every_forwarded_token(
    moe_engine: ReferenceMoeServer,  # noqa: F811
) -> None:
    reply = generate(moe_engine)
    choice = reply["choices"][0]
    out = choice["token_ids"]
    assert len(out) == 12 and choice["finish_reason"] == "length"
    rows = decode(choice["routed_experts"])
    # vLLM's shape: prompt and sampled tokens but the last (never fed back), per layer, top-k.
    assert rows.shape == (len(PROMPT) + len(out) - 1, LAYERS, TOP_K)
    assert rows.dtype == np.uint8 and int(rows.max()) < 8
    assert all(len(set(r)) == TOP_K for r in rows.reshape(-1, TOP_K).tolist())
    content = choice["logprobs"]["content"]
    assert [c["token_id"] for c in content] == out
    for entry in content:
        assert entry["top_logprobs"][0]["token_id"] == entry["token_id"]
        assert len(entry["top_logprobs"]) <= 2 and entry["logprob"] <= 0.0
    assert reply["usage"]["prompt_tokens"] == len(PROMPT)
    # The Gateway's own reader takes it as it takes vLLM's.
    url = moe_engine.url
    body = json.dumps(reply).encode()
    assert extract_completion(url, PROMPT, completion_reply(url, body, True)).output_ids == out
    routing, why = vllm_routing(choice["routed_experts"], len(PROMPT), len(out), 0)
    assert why is None and routing is not None and np.array_equal(routing.array(), rows)


def test_prompt_start_drops_leading_prompt_rows_and_nothing_else(
    moe_engine: ReferenceMoeServer,  # noqa: F811
) -> None:
    whole = generate(moe_engine)["choices"][0]
    cut = generate(moe_engine, routed_experts_prompt_start=5)["choices"][0]
    assert cut["token_ids"] == whole["token_ids"]
    assert np.array_equal(decode(cut["routed_experts"]), decode(whole["routed_experts"])[5:])
    everything = generate(moe_engine, routed_experts_prompt_start=len(PROMPT))["choices"][0]
    assert decode(everything["routed_experts"]).shape[0] == len(whole["token_ids"]) - 1


def test_stream_folds_to_the_whole_reply_with_routing_on_the_last_chunk(
    moe_engine: ReferenceMoeServer,  # noqa: F811
) -> None:
    whole = generate(moe_engine)["choices"][0]
    sampling = {"temperature": 1.0, "seed": 7, "max_tokens": 12, "logprobs": 2}
    body = {"token_ids": PROMPT, "sampling_params": sampling, "stream": True}
    with httpx.stream("POST", f"{moe_engine.url}/inference/v1/generate", json=body) as resp:
        lines = [line for line in resp.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[5:]) for line in lines[:-1]]
    routing = [c["choices"][0].get("routed_experts") for c in chunks]
    assert routing[:-1] == [None] * (len(chunks) - 1)
    assert np.array_equal(decode(routing[-1]), decode(whole["routed_experts"]))
    merge = stream_merge(moe_engine.url, generate=True)
    for line in lines:
        merge.line(line)
    assert merge.reply().choices[0].token_ids == whole["token_ids"]


def test_regex_and_logit_bias_steer_sampling(moe_engine: ReferenceMoeServer) -> None:  # noqa: F811
    steered = generate(moe_engine, structured_outputs={"regex": "ab{2,3}"}, max_tokens=20)
    assert steered["choices"][0]["finish_reason"] == "stop"
    biased = generate(moe_engine, logit_bias={"42": 100.0}, max_tokens=4)
    assert biased["choices"][0]["token_ids"] == [42] * 4


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"repetition_penalty": 1.2}, "sampling_params.repetition_penalty"),
        ({"routed_experts_prompt_start": len(PROMPT) + 1}, "routed_experts_prompt_start"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "structured_outputs.regex"),
    ],
)
def test_what_it_cannot_do_is_a_400_naming_the_field(
    moe_engine: ReferenceMoeServer,  # noqa: F811
    params: dict[str, Any],
    named: str,
) -> None:
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2, **params}}
    reply = httpx.post(f"{moe_engine.url}/inference/v1/generate", json=body, timeout=60)
    assert reply.status_code == 400
    assert named in reply.json()["error"]["message"]


def test_independent_recomputation_agrees_and_catches_shifted_routing(
    moe_engine: ReferenceMoeServer,  # noqa: F811
    moe_model_dir: Path,  # noqa: F811
) -> None:
    sequences = []
    for seed in (1, 2, 3):
        choice = generate(moe_engine, seed=seed, max_tokens=40)["choices"][0]
        sequences.append(
            RoutedSequence(
                name=f"seed{seed}",
                token_ids=PROMPT + choice["token_ids"],
                routed_experts=choice["routed_experts"],
            )
        )
    # Control: the same rows one token late must disagree, so the check can fail.
    late = [
        s.model_copy(
            update={"name": f"late-{s.name}", "token_ids": s.token_ids[1:] + s.token_ids[:1]}
        )
        for s in sequences
    ]
    report = recompute_routing(moe_model_dir, sequences + late)
    for sequence in sequences:
        counts = report.total(sequence.name)
        assert counts.compared + counts.ties == (len(PROMPT) + 40 - 1) * LAYERS
        assert counts.agree == counts.compared, report.mismatches
        assert counts.ties <= counts.compared // 100
    for sequence in late:
        counts = report.total(sequence.name)
        assert counts.agree < counts.compared * 0.6
