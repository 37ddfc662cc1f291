"""Codex CLI (`codex exec`) against the Gateway's OpenAI Responses endpoint.

Facts (checked with Codex 0.171.0): only
`wire_api = "responses"` exists; the provider must be a *custom* one (the built-in
"OpenAI" provider tries WebSockets and remote compaction); the key comes from the env
var named by `env_key`; unknown models need `model_context_window`; `codex exec` has no
`-a`, so approvals are set in config and its own sandbox is bypassed (we are the
sandbox). Compaction is an ordinary `/responses` call whose last user message starts
with the checkpoint-compaction instruction; subagents carry `x-openai-subagent`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from harnesses.base import (
    PROBE_RULE,
    CliHarness,
    HarnessConfig,
    HarnessContext,
    read_sandbox_text,
    write_sandbox_file,
)
from harnesses.config_files import toml_dumps
from sandboxes.base import Sandbox
from schemas import agent_versions as versions
from schemas.outcome import AgentResult, LogSpec
from schemas.scenes import Scene, SceneRule

PROVIDER_ID = "rollout_gateway"
#: Env var Codex reads the session token from (`env_key` of our provider).
KEY_ENV = "ROLLOUT_GATEWAY_API_KEY"
COMPACTION_MARKER = "You are performing a CONTEXT CHECKPOINT COMPACTION"


class CodexConfig(HarnessConfig):
    #: Auto-compaction threshold; default 90% of `context_window`.
    auto_compact_token_limit: int | None = None
    reasoning_effort: str | None = None
    #: `--disable FEATURE` switches (e.g. "multi_agent" to forbid subagents).
    disable_features: list[str] = Field(default_factory=list)
    #: Extra top-level config.toml keys (merged last).
    extra_config: dict[str, Any] = Field(default_factory=dict)


class CodexHarness(CliHarness):
    name = "codex"
    binary = "codex"
    config_model = CodexConfig
    pinned_version = versions.CODEX_VERSION
    config: CodexConfig

    @property
    def codex_home(self) -> str:
        return f"{self.state_dir}/codex"

    @property
    def last_message_path(self) -> str:
        return f"{self.state_dir}/last_message.txt"

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"CODEX_HOME": self.codex_home, KEY_ENV: ctx.endpoints.token}

    def config_toml(self, ctx: HarnessContext) -> dict[str, Any]:
        c = self.config
        limit = c.auto_compact_token_limit or int(c.context_window * 0.9)
        cfg: dict[str, Any] = {
            "model": c.model,
            "model_provider": PROVIDER_ID,
            "model_context_window": c.context_window,
            "model_auto_compact_token_limit": limit,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
            # The sandbox has no network: a web_search tool could only fail.
            "web_search": "disabled",
        }
        if c.reasoning_effort:
            cfg["model_reasoning_effort"] = c.reasoning_effort
        cfg.update(c.extra_config)
        cfg["analytics"] = {"enabled": False}
        cfg["feedback"] = {"enabled": False}
        cfg["model_providers"] = {
            PROVIDER_ID: {
                # Must not be "OpenAI": that name switches on WebSockets + remote compaction.
                "name": "rollout-gateway",
                "base_url": ctx.endpoints.openai_base_url,
                "env_key": KEY_ENV,
                "wire_api": "responses",
                "request_max_retries": 2,
                "stream_max_retries": 2,
            }
        }
        return cfg

    async def write_config(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        await write_sandbox_file(
            sandbox, f"{self.codex_home}/config.toml", toml_dumps(self.config_toml(ctx))
        )

    def command(self, ctx: HarnessContext) -> list[str]:
        argv = [self.executable, "exec", "--skip-git-repo-check"]
        argv += ["--dangerously-bypass-approvals-and-sandbox", "--json"]
        argv += ["-C", ctx.workdir, "-m", self.config.model, "-o", self.last_message_path]
        for feature in self.config.disable_features:
            argv += ["--disable", feature]
        return [*argv, "--", ctx.prompt]

    def log_specs(self) -> list[LogSpec]:
        return [
            LogSpec(path=f"{self.codex_home}/sessions", patterns=["*.jsonl"], kind="transcript"),
            LogSpec(path=self.last_message_path, kind="final_message"),
        ]

    async def parse_result(
        self, sandbox: Sandbox, ctx: HarnessContext, result: AgentResult
    ) -> AgentResult:
        result.final_message = await read_sandbox_text(sandbox, self.last_message_path)
        for line in result.stdout_tail.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("type") if isinstance(event, dict) else None
            if kind == "thread.started":
                result.details["thread_id"] = event.get("thread_id")
            elif kind == "turn.completed":
                result.details["usage"] = event.get("usage")
            elif kind in ("turn.failed", "error"):
                result.details["error"] = event.get("error") or event.get("message")
        return result

    def scene_rules(self) -> list[SceneRule]:
        return [
            PROBE_RULE,
            SceneRule(scene=Scene.compaction, header_equals={"x-openai-subagent": "compact"}),
            SceneRule(
                scene=Scene.other, header_equals={"x-openai-subagent": "memory_consolidation"}
            ),
            SceneRule(scene=Scene.compaction, last_user_contains=COMPACTION_MARKER),
            SceneRule(scene=Scene.subagent, header_present="x-openai-subagent"),
            SceneRule(scene=Scene.subagent, header_present="x-codex-parent-thread-id"),
            SceneRule(scene=Scene.compaction, path_suffix="/responses/compact"),
        ]
