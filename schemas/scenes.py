"""Request scenes: which kind of call an agent made, and which kinds are training data."""

from enum import StrEnum

from pydantic import Field

from schemas.base import StrictModel


class Scene(StrEnum):
    """Why an agent made an LLM call; decides whether the call can become training data."""

    main = "main"
    subagent = "subagent"
    compaction = "compaction"
    summary = "summary"
    title = "title"
    probe = "probe"
    other = "other"


class SceneRule(StrictModel):
    """One data-driven rule: every condition that is set must hold for `scene` to apply."""

    scene: Scene
    path_suffix: str | None = None
    header_present: str | None = None
    header_equals: dict[str, str] = Field(default_factory=dict)
    model_regex: str | None = None
    max_tokens_at_most: int | None = Field(default=None, ge=0)
    system_contains: str | None = None
    last_user_contains: str | None = None
    no_tools: bool | None = None


class SceneConfig(StrictModel):
    """Per-session scene policy: rules (a harness profile plus task overrides, named by
    `profile` for the record) tried before the built-in marker rules, and
    the set of scenes whose segments become training samples."""

    profile: str = "generic"
    rules: list[SceneRule] = Field(default_factory=list)
    trainable: list[Scene] = Field(
        default_factory=lambda: [Scene.main, Scene.subagent, Scene.compaction]
    )
