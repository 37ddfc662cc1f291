"""The tiny task family through the whole stack: Temporal, a worker, local sandboxes with
the task agent inside, the Gateway and an engine that gives the reference answers.

The engine is the scripted one (deterministic: the point is the plumbing, not a model):
for the weather task it first writes the tool call, and only once the prompt holds the
tool's result does it answer, so a reward of 1 proves the agent's multi-turn tool round
trip through the Gateway and the `evaluate` hook's scoring of ``answer.txt``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from tokenizers import Tokenizer

import workers.demo as demo
from devstack.tiny_model import ensure_tiny_model
from devstack.tiny_model.task_agent import weather_reply
from devstack.tiny_model.tasks import heldout_cases, write_task_files
from rollout_client.storage import read_table

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]

THINK = "<think>\n\n</think>\n\n"


async def test_reference_replies_earn_reward_one_through_the_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = heldout_cases(0, 4)
    _, heldout = write_task_files(tmp_path / "tasks", seed=0, n_train=1, n_heldout=4)
    rules: list[tuple[str, str]] = []
    for case in cases:
        if case.kind == "weather":
            result = weather_reply(case.weather, json.dumps({"city": case.city}))
            rules.append((result, THINK + case.answer))
            call = {"name": "get_weather", "arguments": {"city": case.city}}
            rules.append((case.prompt, f"{THINK}<tool_call>\n{json.dumps(call)}\n</tool_call>"))
        else:
            rules.append((case.prompt, THINK + case.answer))
    monkeypatch.setattr(demo, "DEMO_SCRIPT_RULES", rules)
    code = await demo.run_demo(
        tmp_path / "data", "scripted", 1, keep=False, console=Console(), tasks_file=heldout
    )
    assert code == 0
    rows = read_table(str(tmp_path / "data" / "samples")).to_pylist()
    assert sorted(r["task_id"] for r in rows) == sorted(c.task_id for c in cases)
    assert {(r["task_id"], r["status"], r["reward"]) for r in rows} == {
        (c.task_id, "ok", 1.0) for c in cases
    }
    tok = Tokenizer.from_file(str(ensure_tiny_model() / "tokenizer.json"))
    weather = next(r for r in rows if r["task_id"].endswith("weather"))
    text = tok.decode(weather["response_ids"], skip_special_tokens=False)
    assert "</tool_call><|im_end|>" in text and "<tool_response>\n{" in text
