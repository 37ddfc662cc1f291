"""Who chooses each sampling field (`SamplingControl.apply`): pinned fields take the
session's value or the engine's default whatever the agent sends, and say what the
agent asked; agent-chosen fields take the agent's value, else the session's;
`max_tokens` is always a cap."""

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.sampling import CONTROLLED_FIELDS, SamplingControl, SamplingParams
from schemas.session import SessionConfig
from schemas.tasks import RolloutTask

#: Two distinct valid values per field: (the session's, the agent's).
VALUES: dict[str, tuple[Any, Any]] = {
    "temperature": (1.0, 0.2),
    "top_p": (1.0, 0.5),
    "top_k": (-1, 5),
    "min_p": (0.0, 0.3),
    "seed": (7, 8),
    "presence_penalty": (0.0, 1.5),
    "frequency_penalty": (0.0, -1.0),
    "repetition_penalty": (1.0, 1.3),
    "logit_bias": ({5: 1.0}, {9: 100.0}),
    "stop": (["</s>"], ["STOP"]),
}
AGENT_CHOOSABLE = [name for name in CONTROLLED_FIELDS if name != "engine_extra"]


def test_every_controlled_field_has_test_values() -> None:
    assert set(VALUES) == set(AGENT_CHOOSABLE)
    assert set(CONTROLLED_FIELDS) | {"max_tokens"} == set(SamplingParams.model_fields)


def test_the_default_pins_all_that_shapes_the_distribution_and_leaves_stop() -> None:
    control = SamplingControl()
    agent = [n for n in AGENT_CHOOSABLE if getattr(control, n) == "agent"]
    assert agent == ["stop"]
    assert control.on_conflict == "override"
    assert SessionConfig(rollout_id="r").sampling_control == control
    task = {"task_id": "t", "prompt": "p", "harness": {"name": "command"}}
    assert RolloutTask.model_validate(task).sampling_control == control


@pytest.mark.parametrize("name", AGENT_CHOOSABLE)
def test_a_pinned_field_is_the_sessions_and_reports_what_the_agent_asked(name: str) -> None:
    mine, theirs = VALUES[name]
    control = SamplingControl.model_validate({name: "pinned"})
    applied = control.apply(SamplingParams(**{name: mine}), SamplingParams(**{name: theirs}))
    assert getattr(applied.used, name) == mine
    wire = SamplingParams(**{name: theirs}).model_dump(mode="json")[name]
    assert applied.overridden == {name: wire}
    # the agent sending the pinned value itself is no conflict
    same = control.apply(SamplingParams(**{name: mine}), SamplingParams(**{name: mine}))
    assert getattr(same.used, name) == mine and same.overridden == {}
    # nor is leaving it out
    quiet = control.apply(SamplingParams(**{name: mine}), SamplingParams())
    assert getattr(quiet.used, name) == mine and quiet.overridden == {}


@pytest.mark.parametrize("name", AGENT_CHOOSABLE)
def test_a_field_pinned_unset_is_the_engines_default(name: str) -> None:
    """The session pins "engine default" by leaving the field unset: nothing the agent
    sends reaches the engine."""
    _, theirs = VALUES[name]
    control = SamplingControl.model_validate({name: "pinned"})
    applied = control.apply(SamplingParams(), SamplingParams(**{name: theirs}))
    assert getattr(applied.used, name) is None
    assert name in applied.overridden


@pytest.mark.parametrize("name", AGENT_CHOOSABLE)
def test_an_agent_chosen_field_is_the_agents_else_the_sessions(name: str) -> None:
    mine, theirs = VALUES[name]
    control = SamplingControl.model_validate({name: "agent"})
    session = SamplingParams(**{name: mine})
    chosen = control.apply(session, SamplingParams(**{name: theirs}))
    assert getattr(chosen.used, name) == theirs and chosen.overridden == {}
    assert getattr(control.apply(session, SamplingParams()).used, name) == mine
    assert getattr(control.apply(SamplingParams(), SamplingParams()).used, name) is None


def test_fields_are_independent() -> None:
    """Choosing one field leaves the others pinned in the same call."""
    control = SamplingControl(temperature="agent")
    session = SamplingParams(temperature=1.0, top_p=1.0)
    applied = control.apply(session, SamplingParams(temperature=0.3, top_p=0.2, top_k=4))
    assert (applied.used.temperature, applied.used.top_p, applied.used.top_k) == (0.3, 1.0, None)
    assert applied.overridden == {"top_p": 0.2, "top_k": 4}


def test_max_tokens_is_a_cap_whoever_sets_it() -> None:
    control = SamplingControl()
    capped = SamplingParams(max_tokens=256)
    assert control.apply(capped, SamplingParams(max_tokens=4096)).used.max_tokens == 256
    assert control.apply(capped, SamplingParams(max_tokens=10)).used.max_tokens == 10
    assert control.apply(capped, SamplingParams()).used.max_tokens == 256
    assert control.apply(SamplingParams(), SamplingParams(max_tokens=10)).used.max_tokens == 10
    applied = control.apply(capped, SamplingParams(max_tokens=4096))
    assert applied.overridden == {}


def test_engine_extra_is_always_the_sessions() -> None:
    with pytest.raises(ValidationError, match="engine_extra"):
        SamplingControl.model_validate({"engine_extra": "agent"})
    extra = {"structured_outputs": {"regex": "a+"}}
    applied = SamplingControl().apply(
        SamplingParams(engine_extra=extra), SamplingParams(engine_extra={"ignore_eos": True})
    )
    assert applied.used.engine_extra == extra
    assert applied.overridden == {"engine_extra": {"ignore_eos": True}}


def test_logit_bias_is_checked_like_the_other_fields() -> None:
    """Token ids as the wire sends them (string keys) become ids; biases stay in
    OpenAI's range."""
    assert SamplingParams.model_validate({"logit_bias": {"12": -5}}).logit_bias == {12: -5.0}
    with pytest.raises(ValidationError, match="logit_bias"):
        SamplingParams.model_validate({"logit_bias": {"12": 101}})
    with pytest.raises(ValidationError, match="logit_bias"):
        SamplingParams.model_validate({"logit_bias": {"-1": 1}})
    with pytest.raises(ValidationError, match="logit_bias"):
        SamplingParams.model_validate({"logit_bias": {"eos": 1}})


def test_unknown_choices_and_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="temperature"):
        SamplingControl.model_validate({"temperature": "free"})
    with pytest.raises(ValidationError, match="max_tokens"):
        SamplingControl.model_validate({"max_tokens": "agent"})
    with pytest.raises(ValidationError, match="on_conflict"):
        SamplingControl.model_validate({"on_conflict": "ignore"})
