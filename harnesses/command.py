"""Any CLI agent from a shell command template plus env.

Why: new or in-house agents should not need a Python module before they can be rolled
out. The template is a shell command; `{{name}}` placeholders are replaced with
shell-quoted values (so a prompt with quotes or newlines is safe). The standard
OpenAI/Anthropic env vars point at the Gateway session, so many OpenAI-compatible
agents work without any placeholder at all.

Placeholders: prompt, prompt_file, openai_base_url, anthropic_base_url, api_key, model,
workdir, state_dir, rollout_id, context_window.
"""

from __future__ import annotations

import hashlib
import re
import shlex

from pydantic import Field

from harnesses.base import (
    PROBE_RULE,
    CliHarness,
    HarnessConfig,
    HarnessContext,
)
from schemas.outcome import LogSpec
from schemas.scenes import SceneRule

_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
PLACEHOLDERS = frozenset(
    {
        "prompt",
        "prompt_file",
        "openai_base_url",
        "anthropic_base_url",
        "api_key",
        "model",
        "workdir",
        "state_dir",
        "rollout_id",
        "context_window",
    }
)


class CommandConfig(HarnessConfig):
    #: Shell command template, e.g. ``my-agent --task {{prompt}} --base {{openai_base_url}}``.
    command: str
    #: Env var templates (values may use placeholders; they are *not* shell-quoted).
    env_template: dict[str, str] = Field(default_factory=dict)
    #: Shell command printing the agent's version (lineage); default: template hash.
    version_command: str | None = None
    #: Where the agent writes its own logs/transcripts.
    logs: list[LogSpec] = Field(default_factory=list)
    #: Scene rules for this agent (the probe rule is always included).
    rules: list[SceneRule] = Field(default_factory=list)


class CommandHarness(CliHarness):
    name = "command"
    binary = "sh"
    config_model = CommandConfig
    config: CommandConfig

    def __init__(self, config: CommandConfig | dict | None = None) -> None:  # type: ignore[type-arg]
        super().__init__(config)
        unknown = {m.group(1) for m in _PLACEHOLDER.finditer(self.config.command)} - PLACEHOLDERS
        for v in self.config.env_template.values():
            unknown |= {m.group(1) for m in _PLACEHOLDER.finditer(v)} - PLACEHOLDERS
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {sorted(unknown)}; known: {sorted(PLACEHOLDERS)}"
            )
        self.executable = self.config.executable or "/bin/sh"
        digest = hashlib.sha256(self.config.command.encode()).hexdigest()[:12]
        self.template_version = f"command-{digest}"

    def values(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "prompt": ctx.prompt,
            "prompt_file": f"{self.state_dir}/prompt.txt",
            "openai_base_url": ctx.endpoints.openai_base_url,
            "anthropic_base_url": ctx.endpoints.anthropic_base_url,
            "api_key": ctx.endpoints.token,
            "model": self.config.model,
            "workdir": ctx.workdir,
            "state_dir": self.state_dir,
            "rollout_id": ctx.rollout_id,
            "context_window": str(self.config.context_window),
        }

    def render(self, template: str, ctx: HarnessContext, *, quote: bool) -> str:
        vals = self.values(ctx)
        return _PLACEHOLDER.sub(
            lambda m: shlex.quote(vals[m.group(1)]) if quote else vals[m.group(1)], template
        )

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        e = ctx.endpoints
        env = {
            "OPENAI_BASE_URL": e.openai_base_url,
            "OPENAI_API_BASE": e.openai_base_url,
            "OPENAI_API_KEY": e.token,
            "ANTHROPIC_BASE_URL": e.anthropic_base_url,
            "ANTHROPIC_API_KEY": e.token,
            "ROLLOUT_MODEL": self.config.model,
            "ROLLOUT_PROMPT_FILE": f"{self.state_dir}/prompt.txt",
        }
        for k, v in self.config.env_template.items():
            env[k] = self.render(v, ctx, quote=False)
        return env

    def command(self, ctx: HarnessContext) -> list[str]:
        return [self.executable, "-c", self.render(self.config.command, ctx, quote=True)]

    def version_command(self) -> str:
        return self.config.version_command or "true"

    async def probe_version(self, sandbox) -> str:  # type: ignore[no-untyped-def]
        if not self.config.version_command:
            return self.template_version
        version = await super().probe_version(sandbox)
        return f"{version}+{self.template_version}"

    def log_specs(self) -> list[LogSpec]:
        return list(self.config.logs)

    def scene_rules(self) -> list[SceneRule]:
        return [*self.config.rules, PROBE_RULE]
