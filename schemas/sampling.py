"""Sampling parameters: what a session imposes, who may choose each field, and what was
actually used per call.

The behaviour policy a trainer corrects for is the one its rollouts were sampled with,
so by default a session pins every field that shapes the token distribution: an agent
(Claude Code sends `temperature=1`, other CLIs their own values) cannot change it per
call. `SamplingControl` says, field by field, what the session pins and what it leaves
to the agent; `SamplingControl.apply` is the one rule that turns the session's values
and an agent's request into what the engine gets.
"""

from typing import Annotated, Any, Literal

from pydantic import Field

from schemas.base import StrictModel

LOGIT_BIAS_LIMIT = 100.0
"""Largest bias magnitude (OpenAI's range; vLLM clamps to it)."""

Bias = Annotated[float, Field(ge=-LOGIT_BIAS_LIMIT, le=LOGIT_BIAS_LIMIT)]


class SamplingParams(StrictModel):
    """Engine sampling parameters; None (or empty) means "not set".

    In a session config these are the policy's values (`SamplingControl` says which of
    them the agent may change). On a recorded call they are the parameters actually sent
    to the engine, where a field left unset was the engine's default.
    `engine_extra` passes engine-specific fields (e.g. vLLM `structured_outputs`) verbatim.
    """

    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    logit_bias: dict[Annotated[int, Field(ge=0)], Bias] | None = Field(
        default=None, description="token id → bias added to its logit before sampling"
    )
    engine_extra: dict[str, Any] = Field(default_factory=dict)


Choice = Literal["pinned", "agent"]
"""`pinned`: the session's value, or the engine's default when the session leaves the
field unset; `agent`: the agent's value when it sends one, else the session's, else the
engine's default."""

CONTROLLED_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stop",
    "engine_extra",
)
"""Every `SamplingParams` field but `max_tokens`, which is always a cap (the smaller of
the session's and the agent's applies)."""


class SamplingControl(StrictModel):
    """Who chooses each sampling field of a session's calls, and what a call that asks a
    pinned field for another value gets.

    Defaults are what an RL trainer needs: everything that shapes the distribution of a
    sampled token is pinned, so the behaviour policy is the one the trainer set. `stop`
    is the agent's: a stop sequence ends a reply early but changes no token's
    probability. `engine_extra` is always the session's: no protocol carries
    engine-specific fields from an agent. The number of logprobs asked of the engine is
    the Gateway's own setting, never a sampling field.
    """

    temperature: Choice = "pinned"
    top_p: Choice = "pinned"
    top_k: Choice = "pinned"
    min_p: Choice = "pinned"
    seed: Choice = "pinned"
    presence_penalty: Choice = "pinned"
    frequency_penalty: Choice = "pinned"
    repetition_penalty: Choice = "pinned"
    logit_bias: Choice = "pinned"
    stop: Choice = "agent"
    engine_extra: Literal["pinned"] = "pinned"
    on_conflict: Literal["override", "refuse"] = Field(
        default="override",
        description="a call asking a pinned field for another value: `override` serves it "
        "with the pinned value and records the agent's in the call's `sampling_overridden` "
        "(agent CLIs send their own temperature and keep working); `refuse` answers a 400 "
        "naming the field",
    )

    def apply(self, session: SamplingParams, requested: SamplingParams) -> "AppliedSampling":
        """What the engine gets for a call: per field, the pinned value or the agent's
        choice (see `Choice`), and `max_tokens` the smaller of the two caps.

        A pinned field the agent set to anything else (including any value at all when
        the session pins the engine's default) is reported in `overridden` with the
        agent's value; `on_conflict` decides what the caller does with it."""
        used: dict[str, Any] = {}
        overridden: dict[str, Any] = {}
        for name in CONTROLLED_FIELDS:
            mine, theirs = getattr(session, name), getattr(requested, name)
            if getattr(self, name) == "agent":
                used[name] = theirs if _is_set(theirs) else mine
                continue
            used[name] = mine
            if _is_set(theirs) and theirs != mine:
                overridden[name] = requested.model_dump(mode="json", include={name})[name]
        caps = [m for m in (session.max_tokens, requested.max_tokens) if m is not None]
        used["max_tokens"] = min(caps) if caps else None
        return AppliedSampling(used=SamplingParams.model_validate(used), overridden=overridden)


class AppliedSampling(StrictModel):
    """One call's sampling: what the engine gets, and what the agent asked of pinned
    fields that it did not get (field → the agent's value, as JSON)."""

    used: SamplingParams
    overridden: dict[str, Any] = Field(default_factory=dict)


def _is_set(value: Any) -> bool:
    """A field the request sets: not None, and not the empty `engine_extra`."""
    return value is not None and value != {}
