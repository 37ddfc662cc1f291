"""The incremental path against every real chat template (the manifest in devstack).

The templates, families and the oracle run live in `tests/fixtures/real_templates.py`;
a template is read in place and checksum-verified, never copied. The planner renders
windows where the template's probe allows it (`test_windowed_render` pins those
decisions), so the oracle checks here cover the windowed path for those templates.
"""

from __future__ import annotations

import pytest

from schemas.trajectory import MatchKind
from tests.fixtures.real_templates import (
    APPEND_ONLY,
    EXPECTED_FORKS,
    FAMILIES,
    QWEN,
    TINY,
    conversation,
    echo,
    expected_new_text,
    load,
    run,
    template_names,
)

TEMPLATES = template_names()


def test_every_model_family_has_its_template() -> None:
    """The real templates are exactly those with a known family (none missing, none
    silently run with the Qwen default)."""
    assert sorted(set(TEMPLATES) - {TINY}) == sorted(FAMILIES)


@pytest.mark.parametrize("name", TEMPLATES)
def test_probe_finds_a_way_to_express_tool_calls(name: str) -> None:
    assert load(name)[0].supports_tools


@pytest.mark.parametrize("name", TEMPLATES)
def test_new_parts_are_exactly_what_the_template_renders_after_our_reply(name: str) -> None:
    result = run(name)
    steps = conversation()
    family = FAMILIES.get(name, QWEN)
    encode = result.tokenizer.encode
    forks: dict[int, str] = {}
    for i, plan in enumerate(result.plans):
        full = result.renders[i]
        if plan.kind is MatchKind.fork:
            forks[i] = plan.fork_reason or ""
            assert plan.prompt_ids == encode(full)
            continue
        previous = steps[i - 1]
        drifted = echo(previous.reply, i - 1) != previous.reply
        assert plan.kind is (MatchKind.realign if drifted else MatchKind.clean)
        assert plan.new_text == expected_new_text(full, family, previous.nonce, not previous.cut)
        assert plan.prompt_ids == result.held_before[i] + encode(plan.new_text)
        assert plan.new_token_count == len(encode(plan.new_text))
    expected = {0: "no held segment", **EXPECTED_FORKS.get(name, {})}
    assert sorted(forks) == sorted(expected), forks
    for i, reason in expected.items():
        assert forks[i].startswith(reason), forks[i]
    assert len(result.segments) == len(expected)


@pytest.mark.parametrize("name", TEMPLATES)
def test_held_tokens_keep_every_sampled_id_under_the_loss_mask(name: str) -> None:
    result = run(name)
    for seg in result.segments:
        trained = [i for i, m in zip(seg.ids, seg.mask, strict=True) if m]
        assert trained == result.outputs[seg.segment_id]
        assert all(lp == -0.5 for lp, m in zip(seg.logprobs, seg.mask, strict=True) if m)


@pytest.mark.parametrize("name", TEMPLATES)
def test_append_only_templates_hold_exactly_the_full_render(name: str) -> None:
    """With exact echoes; a re-formatted echo re-renders differently by design."""
    result = run(name, drifting_echoes=False)
    final = result.tokenizer.decode(result.plans[-1].prompt_ids)
    if name in APPEND_ONLY:
        assert final == result.renders[-1]
    else:
        assert final != result.renders[-1]
