"""Hermes Agent (`hermes -z`) against the Gateway's Chat Completions endpoint.

Facts (checked with Hermes 0.19.0): config lives
in `$HERMES_HOME/config.yaml`; `model.provider: custom` + `model.base_url` (Hermes
appends `/chat/completions`) + `model.api_key` (sent as the bearer); Hermes refuses a
context window under 64,000 tokens, so `model.context_length` is always set and never
below that floor; `-z` is one-shot with approvals bypassed. Its auxiliary calls
(titles, context compression, delegated subagents) are recognised by prompt markers.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from harnesses.base import (
    PROBE_RULE,
    CliHarness,
    HarnessConfig,
    HarnessContext,
    write_sandbox_file,
)
from harnesses.config_files import yaml_dumps
from sandboxes.base import Sandbox
from schemas import agent_versions as versions
from schemas.outcome import AgentResult, LogSpec
from schemas.scenes import Scene, SceneRule

#: Hermes' hard floor on the context window (agent/model_metadata.py).
HERMES_MIN_CONTEXT = 64_000
TITLE_MARKER = "Generate a short, descriptive title (3-7 words)"
COMPACTION_MARKER = "You are a summarization agent creating a context checkpoint"
SUBAGENT_MARKER = "You are a focused subagent working on a specific delegated task"


class HermesConfig(HarnessConfig):
    max_turns: int | None = None
    #: `-t` toolsets (comma list); default: Hermes' CLI defaults.
    toolsets: str | None = None
    #: Extra top-level config.yaml keys (merged last, shallow).
    extra_config: dict[str, Any] = Field(default_factory=dict)


class HermesHarness(CliHarness):
    name = "hermes"
    binary = "hermes"
    config_model = HermesConfig
    pinned_version = versions.HERMES_VERSION
    config: HermesConfig

    @property
    def hermes_home(self) -> str:
        return f"{self.state_dir}/hermes"

    @property
    def usage_path(self) -> str:
        return f"{self.state_dir}/hermes-usage.json"

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"HERMES_HOME": self.hermes_home, "HERMES_DISABLE_LAZY_INSTALLS": "1"}

    def config_yaml(self, ctx: HarnessContext) -> dict[str, Any]:
        c = self.config
        model: dict[str, Any] = {
            "provider": "custom",
            "base_url": ctx.endpoints.openai_base_url,
            "default": c.model,
            "api_key": ctx.endpoints.token,
            "api_mode": "chat_completions",
            "context_length": max(c.context_window, HERMES_MIN_CONTEXT),
        }
        if c.max_output_tokens:
            model["max_tokens"] = c.max_output_tokens
        cfg: dict[str, Any] = {
            "model": model,
            # No network in the sandbox: do not fetch the remote model catalog, and do not
            # pip-install optional tool deps at startup (the TTS check alone waits ~10 s
            # for a pip that cannot reach PyPI).
            "model_catalog": {"enabled": False},
            "security": {"allow_lazy_installs": False},
        }
        if c.max_turns:
            cfg["agent"] = {"max_turns": c.max_turns}
        cfg.update(c.extra_config)
        return cfg

    async def write_config(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        await write_sandbox_file(
            sandbox, f"{self.hermes_home}/config.yaml", yaml_dumps(self.config_yaml(ctx))
        )

    def command(self, ctx: HarnessContext) -> list[str]:
        argv = [self.executable, "-z", ctx.prompt, "--usage-file", self.usage_path]
        if self.config.toolsets:
            argv += ["-t", self.config.toolsets]
        return argv

    def log_specs(self) -> list[LogSpec]:
        return [
            LogSpec(path=f"{self.hermes_home}/sessions", kind="transcript"),
            LogSpec(path=f"{self.hermes_home}/state.db", kind="transcript"),
            LogSpec(path=f"{self.hermes_home}/logs", patterns=["*.log"], kind="log"),
            LogSpec(path=self.usage_path, kind="usage"),
        ]

    async def parse_result(
        self, sandbox: Sandbox, ctx: HarnessContext, result: AgentResult
    ) -> AgentResult:
        # `-z` prints only the final answer on stdout.
        text = result.stdout_tail.strip()
        result.final_message = text or None
        return result

    def scene_rules(self) -> list[SceneRule]:
        return [
            PROBE_RULE,
            SceneRule(scene=Scene.title, system_contains=TITLE_MARKER),
            SceneRule(scene=Scene.compaction, last_user_contains=COMPACTION_MARKER),
            SceneRule(scene=Scene.subagent, system_contains=SUBAGENT_MARKER),
        ]
