"""Claude Code (`claude -p`) against the Gateway's Anthropic Messages endpoint.

Facts this relies on (checked with Claude Code 2.1.332): `ANTHROPIC_BASE_URL` is the
host root without `/v1`; as root,
`--dangerously-skip-permissions` needs `IS_SANDBOX=1`; an unknown model gets a 1M window
unless `CLAUDE_CODE_MAX_CONTEXT_TOKENS` is set; `CLAUDE_CODE_GATEWAY_HINT_HEADERS=1`
makes it label each call (`x-claude-code-request-class`), which the scene profile uses.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from harnesses.base import (
    PROBE_RULE,
    CliHarness,
    HarnessConfig,
    HarnessContext,
    write_sandbox_file,
)
from sandboxes.base import Sandbox
from schemas import agent_versions as versions
from schemas.outcome import AgentResult, LogSpec
from schemas.scenes import Scene, SceneRule

#: Text Claude Code appends to the last user message when it asks for a compaction.
COMPACTION_MARKER = "Your task is to create a detailed summary of the conversation so far"
TITLE_MARKER = "You are naming a coding session"
_CLASS = "x-claude-code-request-class"


class ClaudeCodeConfig(HarnessConfig):
    #: "api_key" sends `x-api-key`, "bearer" sends `Authorization: Bearer` (both work).
    auth: Literal["api_key", "bearer"] = "api_key"
    #: Model for subagents / the small-fast slot (default: `model`).
    small_model: str | None = None
    max_turns: int | None = None
    output_format: Literal["stream-json", "json", "text"] = "stream-json"


class ClaudeCodeHarness(CliHarness):
    name = "claude_code"
    binary = "claude"
    config_model = ClaudeCodeConfig
    pinned_version = versions.CLAUDE_CODE_VERSION
    config: ClaudeCodeConfig
    log_dirs: ClassVar[tuple[str, ...]] = ("projects",)

    @property
    def settings_path(self) -> str:
        return f"{self.home}/.claude/settings.json"

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        c = self.config
        small = c.small_model or c.model
        env = {
            "ANTHROPIC_BASE_URL": ctx.endpoints.anthropic_base_url,
            "ANTHROPIC_MODEL": c.model,
            "ANTHROPIC_SMALL_FAST_MODEL": small,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": small,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": c.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": c.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": small,
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(c.context_window),
            "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1",
            # Root inside a container/namespace is still a sandbox: allow skip-permissions.
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        if c.max_output_tokens:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(c.max_output_tokens)
        key = "ANTHROPIC_API_KEY" if c.auth == "api_key" else "ANTHROPIC_AUTH_TOKEN"
        env[key] = ctx.endpoints.token
        return env

    async def write_config(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        # The same env in settings.json keeps child `claude` processes (subagents,
        # hooks) on the Gateway even if they do not inherit our process env.
        settings = {
            "env": {k: v for k, v in self.env.items() if k not in ("HOME", "PATH")},
            "permissions": {"defaultMode": "bypassPermissions"},
            "skipDangerousModePermissionPrompt": True,
        }
        await write_sandbox_file(sandbox, self.settings_path, json.dumps(settings, indent=2))

    def command(self, ctx: HarnessContext) -> list[str]:
        c = self.config
        argv = [self.executable, "-p", ctx.prompt, "--dangerously-skip-permissions"]
        argv += ["--model", c.model, "--output-format", c.output_format]
        if c.output_format == "stream-json":
            argv.append("--verbose")
        if c.max_turns:
            argv += ["--max-turns", str(c.max_turns)]
        return argv

    def log_specs(self) -> list[LogSpec]:
        return [
            LogSpec(path=f"{self.home}/.claude/projects", patterns=["*.jsonl"], kind="transcript")
        ]

    async def parse_result(
        self, sandbox: Sandbox, ctx: HarnessContext, result: AgentResult
    ) -> AgentResult:
        # The last stdout line of json/stream-json output is the `result` event.
        for line in reversed(result.stdout_tail.splitlines()):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") == "result":
                result.final_message = event.get("result")
                for k in ("subtype", "is_error", "num_turns", "session_id", "stop_reason"):
                    if k in event:
                        result.details[k] = event[k]
                break
        return result

    def scene_rules(self) -> list[SceneRule]:
        return [
            PROBE_RULE,
            SceneRule(scene=Scene.compaction, header_equals={_CLASS: "compaction"}),
            SceneRule(scene=Scene.subagent, header_equals={_CLASS: "subagent"}),
            SceneRule(
                scene=Scene.title, header_equals={"x-claude-1p-request-class": "summary-extraction"}
            ),
            SceneRule(scene=Scene.other, header_equals={_CLASS: "auxiliary"}),
            SceneRule(scene=Scene.other, header_equals={_CLASS: "side_reply"}),
            SceneRule(scene=Scene.main, header_equals={_CLASS: "main"}),
            # Without hint headers (older builds, or the switch turned off):
            SceneRule(scene=Scene.compaction, last_user_contains=COMPACTION_MARKER),
            SceneRule(scene=Scene.subagent, header_present="x-claude-code-agent-id"),
            SceneRule(scene=Scene.title, system_contains=TITLE_MARKER),
        ]
