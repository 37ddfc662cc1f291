"""The tiny task family: seeded, valid RolloutTasks, disjoint splits, one right answer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from devstack.tiny_model import render_chat
from devstack.tiny_model.task_agent import weather_reply
from devstack.tiny_model.tasks import (
    AGENT_PATH,
    HELDOUT_SEED,
    HELDOUT_SIZE,
    KINDS,
    VERBOSE_ANSWER,
    TaskCase,
    conversation,
    heldout_cases,
    score,
    train_cases,
    write_task_files,
    wrong_answer,
)
from schemas.tasks import load_tasks


def test_same_seed_same_files_other_seed_other_tasks(tmp_path: Path) -> None:
    a = write_task_files(tmp_path / "a", seed=3, n_train=40, n_heldout=20)
    b = write_task_files(tmp_path / "b", seed=3, n_train=40, n_heldout=20)
    c = write_task_files(tmp_path / "c", seed=4, n_train=40, n_heldout=20)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[0].read_bytes() != c[0].read_bytes()


def test_files_are_valid_rollout_tasks_with_disjoint_prompts(tmp_path: Path) -> None:
    train_path, heldout_path = write_task_files(tmp_path, seed=0, n_train=64, n_heldout=64)
    train, heldout = load_tasks(train_path), load_tasks(heldout_path)
    assert (len(train), len(heldout)) == (64, 64)
    kinds = {t.task_id: t.metadata["kind"] for t in [*train, *heldout]}
    plain = [{t.prompt for t in s if kinds[t.task_id] != "weather"} for s in (train, heldout)]
    assert plain[0] and not plain[0] & plain[1]
    assert Counter(t.metadata["kind"] for t in heldout) == {k: 16 for k in KINDS}
    weather = next(t for t in heldout if t.metadata["kind"] == "weather")
    files = {f["path"] for f in weather.sandbox.spec_fields()["files"]}
    assert AGENT_PATH in files and len(files) == 2
    assert weather.harness.config["env"]["TASK_TOOLS"] == "get_weather"


def test_heldout_is_a_prefix_family_and_train_avoids_all_of_it() -> None:
    canonical = heldout_cases(HELDOUT_SEED, HELDOUT_SIZE)
    assert heldout_cases(HELDOUT_SEED, 10) == canonical[:10]
    train = train_cases(HELDOUT_SEED, 200, canonical)
    assert len({c.key for c in train}) == 200
    assert not {c.key for c in train} & {c.key for c in canonical}


def test_reference_answers_pass_the_rule_and_near_misses_fail() -> None:
    for case in heldout_cases(1, 64):
        assert score(case, case.answer) == 1.0
        assert score(case, f" {case.answer}\n") == 1.0
        assert score(case, wrong_answer(case)) == 0.0
        assert score(case, "") == 0.0


def test_counting_includes_cjk_and_weather_needs_the_tool() -> None:
    cases = heldout_cases(HELDOUT_SEED, HELDOUT_SIZE)
    counts = [c for c in cases if c.kind == "count"]
    cjk = [c for c in counts if any("\u4e00" <= ch <= "\u9fff" for ch in c.prompt)]
    assert cjk and len(cjk) < len(counts)
    weather = [c for c in cases if c.kind == "weather"]
    for c in weather:
        assert c.city is not None and c.answer not in c.prompt
        assert (
            json.loads(weather_reply(c.weather, json.dumps({"city": c.city})))["temperature"]
            == c.answer
        )
    assert weather_reply(weather[0].weather, '{"city": "atlantis"}') == "error: unknown city"


def test_reference_conversation_renders_a_tool_round_trip() -> None:
    case = next(c for c in heldout_cases(HELDOUT_SEED, 8) if c.kind == "weather")
    messages, tools = conversation(case)
    text = render_chat(messages, tools)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert f'{{"name": "get_weather", "arguments": {{"city": "{case.city}"}}}}' in text
    assert text.endswith(f"<think>\n\n</think>\n\n{case.answer}<|im_end|>\n")
    plain = TaskCase(task_id="t", kind="add", prompt="What is 1 + 2?", answer="3")
    assert conversation(plain)[1] is None


def test_the_verbose_style_keeps_the_answer_but_fails_the_check() -> None:
    """The warm-up's chatty answers carry the right content in a format the file check
    rejects: the habit RL has to unlearn, the same for every kind."""
    for case in heldout_cases(HELDOUT_SEED, len(KINDS)):
        messages, _ = conversation(case, verbose=True)
        reply = messages[-1]["content"]
        assert reply == VERBOSE_ANSWER.format(answer=case.answer) != case.answer
        assert case.answer in reply and score(case, reply) == 0.0
        assert messages[:-1] == conversation(case)[0][:-1]
