"""The warm tiny model: deterministic warm-up, cached by recipe hash, served by vLLM in
float32 with log-probabilities that agree with transformers float32.

Slow on a cold cache: the default recipe trains for ~12 min of one idle core (much longer
on a box shared by several agents; then it is cached); the determinism test trains two
5-step models (~1 min).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from devstack.tiny_model import IM_END, ensure_tiny_model, render_chat
from devstack.tiny_model.task_agent import SYSTEM_PROMPT, TOOLS_BY_NAME
from devstack.tiny_model.tasks import HELDOUT_SEED, KINDS, heldout_cases
from devstack.tiny_model.warm import (
    WarmupRecipe,
    build_warm_model,
    ensure_warm_model,
    subprocess_env,
    warm_fingerprint,
)
from devstack.vllm_server import VllmServer, VllmServerConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.needs("warm_model")]


@pytest.fixture(scope="module")
def warm_dir(vllm_python: Path) -> Path:
    return ensure_warm_model(vllm_python)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_warm_up_is_deterministic(vllm_python: Path, tmp_path: Path) -> None:
    recipe = WarmupRecipe(steps=3, style_steps=2, batch_short=4, batch_tool=1)
    a = build_warm_model(tmp_path / "a", vllm_python, recipe)
    b = build_warm_model(tmp_path / "b", vllm_python, recipe)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    stops = [json.loads((d / "warmup.json").read_text())["stop"] for d in (a, b)]
    assert stops[0] == stops[1] and stops[0]["step"] == 4, stops
    assert _sha(a / "tokenizer.json") == _sha(ensure_tiny_model() / "tokenizer.json")


def test_warm_model_is_cached_by_recipe_hash(warm_dir: Path, vllm_python: Path) -> None:
    recipe = WarmupRecipe()
    assert warm_dir.name == f"tiny-warm-{warm_fingerprint(recipe, vllm_python)}"
    mtime = (warm_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_warm_model(vllm_python) == warm_dir
    assert (warm_dir / "model.safetensors").stat().st_mtime_ns == mtime
    assert warm_fingerprint(recipe.model_copy(update={"seed": 1}), vllm_python) not in warm_dir.name
    config = json.loads((warm_dir / "config.json").read_text())
    assert config["torch_dtype"] == "float32"
    assert config["hidden_size"] == recipe.shape.hidden_size
    summary = json.loads((warm_dir / "warmup.json").read_text())
    curve, stop = summary["curve"], summary["stop"]
    assert recipe.steps <= stop["step"] < recipe.steps + recipe.style_steps, stop
    assert curve[-1]["step"] == stop["step"] and curve[-1]["loss"] < curve[0]["loss"] / 10


SHARED_PREFIX = """
import json, sys
import torch
from pathlib import Path
from tokenizers import Tokenizer
from devstack.tiny_model.tasks import HELDOUT_SEED, heldout_cases
from devstack.tiny_model.warm import WarmupRecipe
from devstack.tiny_model import warmup

torch.set_num_threads(1)
base = Path(sys.argv[1])
tok = Tokenizer.from_file(str(base / "tokenizer.json"))
model, _ = warmup.build_model(base, WarmupRecipe())
cases = [c for c in heldout_cases(HELDOUT_SEED, 16) if c.kind == "weather"]
ids, _, attn = warmup._tensors([warmup.encode_conversation(tok, c) for c in cases], 0)
full = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
shared = warmup._hidden_states(model, ids, attn)
keys = [[tok.decode([i]) for i, k in zip(e.ids, e.key) if k] for e in
        (warmup.encode_conversation(tok, c) for c in cases)]
print(json.dumps({"prefix": warmup._common_prefix(ids, attn), "keys": keys,
                  "diff": (full - shared)[attn.bool()].abs().max().item()}))
"""


def test_shared_prefix_forward_equals_the_full_batch(vllm_python: Path) -> None:
    """The warm-up runs the tool instructions every weather conversation starts with
    once per batch; the rows' hidden states must be those of the full forward."""
    cases = [c for c in heldout_cases(HELDOUT_SEED, 16) if c.kind == "weather"]
    cmd = [str(vllm_python), "-c", SHARED_PREFIX, str(ensure_tiny_model())]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=subprocess_env())
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["prefix"] > 200 and got["diff"] < 1e-4, got
    assert ["".join(k) for k in got["keys"]] == [c.city + c.answer for c in cases]


STYLE_PHASE = """
import itertools, json, sys
from pathlib import Path
from tokenizers import Tokenizer
from devstack.tiny_model.tasks import VERBOSE_ANSWER
from devstack.tiny_model.warm import WarmupRecipe
from devstack.tiny_model import warmup

tok = Tokenizer.from_file(str(Path(sys.argv[1]) / "tokenizer.json"))
recipe = WarmupRecipe(steps=2, style_steps=3, batch_short=20, batch_tool=4)
marker = VERBOSE_ANSWER.split("{")[0]
verbose = [
    sum(marker in tok.decode([i for i, m in zip(e.ids, e.mask) if m]) for e in short + tool)
    for short, tool in itertools.islice(warmup.batches(tok, recipe), 5)
]
print(json.dumps(verbose))
"""


def test_the_style_phase_mixes_in_verbose_answers(vllm_python: Path) -> None:
    """The skills are learnt on terse answers only; after `steps` about `verbose_fraction`
    (0.85 of 24 per batch) of the conversations end in the verbose style."""
    cmd = [str(vllm_python), "-c", STYLE_PHASE, str(ensure_tiny_model())]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=subprocess_env())
    verbose = json.loads(out.stdout.splitlines()[-1])
    assert verbose[:2] == [0, 0], verbose
    assert all(10 <= n <= 23 for n in verbose[2:]), verbose


EXPECTED_REWARD = """
import json, sys
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
from devstack.tiny_model.tasks import HELDOUT_SEED, HELDOUT_SIZE, heldout_cases
from devstack.tiny_model.warmup import encode_conversation, expected_reward

torch.set_num_threads(1)
model_dir = sys.argv[1]
tok = Tokenizer.from_file(model_dir + "/tokenizer.json")
pad = json.load(open(model_dir + "/generation_config.json"))["pad_token_id"]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
cases = heldout_cases(HELDOUT_SEED, HELDOUT_SIZE)
print(json.dumps(expected_reward(model, [encode_conversation(tok, c) for c in cases], pad)))
"""


def test_warm_model_starts_in_the_middle_on_heldout_tasks(
    warm_dir: Path, vllm_python: Path
) -> None:
    """Held-out expected reward at temperature 1 (the probability of sampling the
    reference turns, from the saved weights) is in 0.15-0.6: RL has signal and room. It is
    a lower bound of the mean sampled reward. The style phase lowers it on purpose and
    stops once it is inside the recipe's band, on whatever CPU trains it; the value the
    warm-up stopped on is the one the saved weights give."""
    cmd = [str(vllm_python), "-c", EXPECTED_REWARD, str(warm_dir)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=subprocess_env())
    reward = json.loads(out.stdout.splitlines()[-1])
    assert set(reward) == {*KINDS, "mean"}
    assert 0.15 <= reward["mean"] <= 0.6, reward
    summary = json.loads((warm_dir / "warmup.json").read_text())
    low, high = WarmupRecipe().target_band
    assert summary["stop"]["reason"] == "in_band", summary["stop"]
    assert low <= summary["stop"]["heldout_expected_reward"] <= high
    recorded = summary["curve"][-1]["heldout_expected_reward"]["mean"]
    assert recorded == summary["stop"]["heldout_expected_reward"]
    assert recorded == pytest.approx(reward["mean"], abs=1e-3)


def test_vllm_float32_serves_it_and_agrees_with_transformers(
    warm_dir: Path, vllm_python: Path, tmp_path: Path
) -> None:
    tok = Tokenizer.from_file(str(warm_dir / "tokenizer.json"))
    cases = heldout_cases(HELDOUT_SEED, len(KINDS))
    config = VllmServerConfig(
        model_dir=warm_dir,
        python=vllm_python,
        dtype="float32",
        max_model_len=2048,
        extra_args=["--enforce-eager"],
    )
    calls = []
    with VllmServer(config) as server:
        for case in cases:
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": case.prompt},
            ]
            tools = [TOOLS_BY_NAME[n] for n in case.tools] or None
            prompt = tok.encode(render_chat(messages, tools, add_generation_prompt=True)).ids
            body = {
                "model": server.model,
                "prompt": prompt,
                "max_tokens": 48,
                "temperature": 0,
                "logprobs": 1,
                "return_token_ids": True,
            }
            reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            choice = reply.json()["choices"][0]
            out = choice["token_ids"]
            text = tok.decode(out, skip_special_tokens=False)
            assert out[-1] == tok.token_to_id(IM_END), text
            assert text.startswith("<think>\n\n</think>\n\n"), text
            if case.tools:
                assert "<tool_call>\n" in text, text
            calls.append(
                {
                    "prompt_ids": prompt,
                    "response_ids": out,
                    "logprobs": choice["logprobs"]["token_logprobs"],
                }
            )
    (tmp_path / "in.json").write_text(json.dumps(calls))
    cmd = [str(vllm_python), "-m", "devstack.tiny_model.logprobs", str(warm_dir)]
    cmd += [str(tmp_path / "in.json"), str(tmp_path / "out.json")]
    subprocess.run(cmd, check=True, env=subprocess_env())
    ours = json.loads((tmp_path / "out.json").read_text())
    diffs = [
        abs(a - b)
        for call, row in zip(calls, ours, strict=True)
        for a, b in zip(call["logprobs"], row, strict=True)
    ]
    assert sum(diffs) / len(diffs) < 0.01 and max(diffs) < 0.05, diffs
