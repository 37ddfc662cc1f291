"""Sampling parameters: what a session imposes and what was actually used per call."""

from typing import Any

from pydantic import Field

from schemas.base import StrictModel


class SamplingParams(StrictModel):
    """Engine sampling parameters.

    In a session config these are the policy: they win over whatever the agent sends.
    On a recorded call they are the parameters actually sent to the engine.
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
    engine_extra: dict[str, Any] = Field(default_factory=dict)

    def merged_over(self, requested: "SamplingParams") -> "SamplingParams":
        """Session policy wins field by field; the agent's request only fills gaps.

        `max_tokens` is the exception: the smaller of the two applies (the session's is a cap).
        """
        data = requested.model_dump(exclude_none=True)
        policy = self.model_dump(exclude_none=True)
        data.update(policy)
        if self.max_tokens is not None and requested.max_tokens is not None:
            data["max_tokens"] = min(self.max_tokens, requested.max_tokens)
        data["engine_extra"] = {**requested.engine_extra, **self.engine_extra}
        return SamplingParams.model_validate(data)
