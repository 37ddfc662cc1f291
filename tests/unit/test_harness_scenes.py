"""Unit tests: each harness's scene profile is valid data and classifies the requests its
agent really sends (shapes captured from the pinned CLIs' traffic) into
the right scene when the Gateway's classifier applies it."""

from __future__ import annotations

import pytest

from gateway.canonical import CanonicalRequest, Message, Tool
from gateway.sessions.scenes import classify
from harnesses.claude_code import COMPACTION_MARKER as CC_COMPACT
from harnesses.codex import COMPACTION_MARKER as CODEX_COMPACT
from harnesses.hermes import COMPACTION_MARKER as HERMES_COMPACT
from harnesses.hermes import SUBAGENT_MARKER, TITLE_MARKER
from harnesses.registry import get_harness, harness_names
from schemas.sampling import SamplingParams
from schemas.scenes import Scene, SceneConfig, SceneRule

BASH = Tool(name="Bash", parameters={"type": "object"})


def req(
    *,
    protocol: str = "openai_chat",
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
    system: str = "You are an agent.",
    last_user: str = "do the task",
    tools: bool = True,
    max_tokens: int | None = None,
) -> CanonicalRequest:
    return CanonicalRequest(
        protocol=protocol,  # type: ignore[arg-type]
        path=path,
        model="tiny",
        messages=[
            Message(role="system", content=system),
            Message(role="user", content="first"),
            Message(role="assistant", content="ok"),
            Message(role="user", content=last_user),
        ],
        tools=[BASH] if tools else [],
        sampling=SamplingParams(max_tokens=max_tokens),
        headers=headers or {},
    )


def scene(harness: str, request: CanonicalRequest) -> Scene:
    return classify(request, get_harness(harness, _cfg(harness)).scene_config())


def _cfg(name: str) -> dict[str, str]:
    return {"command": "true"} if name == "command" else {}


@pytest.mark.parametrize("name", harness_names())
def test_profiles_are_valid_scene_configs_with_a_probe_rule(name: str) -> None:
    cfg = get_harness(name, _cfg(name)).scene_config()
    again = SceneConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg
    assert any(r.scene == Scene.probe and r.max_tokens_at_most == 1 for r in cfg.rules)
    assert scene(name, req(max_tokens=1)) == Scene.probe
    assert scene(name, req()) == Scene.main


MESSAGES = "/v1/messages"


@pytest.mark.parametrize(
    ("headers", "last_user", "system", "want"),
    [
        ({"X-Claude-Code-Request-Class": "main"}, "task", "sys", Scene.main),
        (
            {"x-claude-code-request-class": "subagent", "x-claude-code-agent-id": "a1"},
            "task",
            "sys",
            Scene.subagent,
        ),
        ({"x-claude-code-request-class": "compaction"}, "task", "sys", Scene.compaction),
        (
            {
                "x-claude-code-request-class": "auxiliary",
                "x-claude-1p-request-class": "summary-extraction",
            },
            "x",
            "sys",
            Scene.title,
        ),
        ({"x-claude-code-request-class": "auxiliary"}, "x", "sys", Scene.other),
        # Without hint headers: the agent-id header, the compaction text, the title prompt.
        ({"x-claude-code-agent-id": "a1"}, "task", "sys", Scene.subagent),
        ({}, f"... {CC_COMPACT}. Include <analysis>", "sys", Scene.compaction),
        ({}, "<session>x</session>", "You are naming a coding session", Scene.title),
    ],
)
def test_claude_code_profile(
    headers: dict[str, str], last_user: str, system: str, want: Scene
) -> None:
    r = req(
        protocol="anthropic_messages",
        path=MESSAGES,
        headers=headers,
        last_user=last_user,
        system=system,
    )
    assert scene("claude_code", r) == want


@pytest.mark.parametrize(
    ("headers", "last_user", "want"),
    [
        ({"x-codex-turn-metadata": '{"request_kind":"turn"}'}, "task", Scene.main),
        ({"x-openai-subagent": "collab_spawn"}, "task", Scene.subagent),
        ({"x-codex-parent-thread-id": "t0"}, "task", Scene.subagent),
        ({"x-openai-subagent": "compact"}, "task", Scene.compaction),
        ({}, f"{CODEX_COMPACT}. Create a handoff summary", Scene.compaction),
    ],
)
def test_codex_profile(headers: dict[str, str], last_user: str, want: Scene) -> None:
    r = req(protocol="openai_responses", path="/v1/responses", headers=headers, last_user=last_user)
    assert scene("codex", r) == want


def test_hermes_profile_markers() -> None:
    assert scene("hermes", req(system=f"{TITLE_MARKER} for a conversation")) == Scene.title
    assert scene("hermes", req(last_user=f"{HERMES_COMPACT}. Treat ...")) == Scene.compaction
    assert scene("hermes", req(system=f"{SUBAGENT_MARKER}.\nGoal: x")) == Scene.subagent


def test_task_rules_come_before_the_profile() -> None:
    h = get_harness(
        "codex",
        {"scene_rules": [SceneRule(scene=Scene.other, header_present="x-openai-subagent")]},
    )
    r = req(protocol="openai_responses", path="/v1/responses", headers={"x-openai-subagent": "x"})
    assert classify(r, h.scene_config()) == Scene.other


@pytest.mark.parametrize(
    ("rule", "holds", "fails"),
    [
        ({"path_suffix": "/completions"}, {}, {"path": "/v1/responses"}),
        ({"header_present": "X-Kind"}, {"headers": {"x-kind": "a"}}, {}),
        (
            {"header_equals": {"X-Kind": "a"}},
            {"headers": {"X-KIND": "a"}},
            {"headers": {"x-kind": "b"}},
        ),
        ({"max_tokens_at_most": 8}, {"max_tokens": 8}, {"max_tokens": 9}),
        ({"max_tokens_at_most": 8}, {"max_tokens": 2}, {}),  # not sent: no match
        ({"no_tools": True}, {"tools": False}, {}),
        ({"system_contains": "name it"}, {"system": "Please name it."}, {}),
        ({"last_user_contains": "quota"}, {"last_user": "quota?"}, {}),
    ],
)
def test_each_condition_of_a_rule_must_hold(
    rule: dict[str, object], holds: dict[str, object], fails: dict[str, object]
) -> None:
    config = SceneConfig(rules=[SceneRule(scene=Scene.other, **rule)])  # type: ignore[arg-type]
    assert classify(req(**holds), config) == Scene.other  # type: ignore[arg-type]
    assert classify(req(**fails), config) == Scene.main  # type: ignore[arg-type]
    both = SceneConfig(rules=[SceneRule(scene=Scene.other, model_regex="^x", **rule)])  # type: ignore[arg-type]
    assert classify(req(**holds), both) == Scene.main  # type: ignore[arg-type]  # "tiny"
