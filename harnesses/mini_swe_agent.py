"""mini-swe-agent (`mini`) against the Gateway's Chat Completions endpoint via litellm.

Facts (checked with mini-swe-agent 2.4.6): `-c` replaces
the default config, so the packaged `mini.yaml` is passed first and our overrides
second (configs merge recursively); `openai/<model>` + `model_kwargs.api_base` routes
litellm to the Gateway; `MSWEA_CONFIGURED=true` skips first-run setup and
`MSWEA_COST_TRACKING=ignore_errors` tolerates a model litellm has no price for.
`-y --exit-immediately` makes it non-interactive; `-o` writes the trajectory.
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
from harnesses.config_files import yaml_dumps
from sandboxes.base import Sandbox
from schemas import agent_versions as versions
from schemas.outcome import AgentResult, LogSpec
from schemas.scenes import SceneRule


class MiniSweAgentConfig(HarnessConfig):
    #: Packaged base config to start from (mini.yaml, swebench.yaml...).
    base_config: str = "mini.yaml"
    #: Max agent steps (0 = unlimited; the wall-clock budget still applies).
    step_limit: int = 0
    #: litellm provider prefix for the model name.
    provider_prefix: str = "openai"
    #: Extra `model.model_kwargs` (e.g. temperature) and extra config (merged last).
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    extra_config: dict[str, Any] = Field(default_factory=dict)


class MiniSweAgentHarness(CliHarness):
    name = "mini_swe_agent"
    binary = "mini"
    config_model = MiniSweAgentConfig
    pinned_version = versions.MINI_SWE_AGENT_VERSION
    config: MiniSweAgentConfig

    @property
    def overrides_path(self) -> str:
        return f"{self.state_dir}/rollout-mini.yaml"

    @property
    def traj_path(self) -> str:
        return f"{self.state_dir}/traj.json"

    @property
    def model_name(self) -> str:
        return f"{self.config.provider_prefix}/{self.config.model}"

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{self.state_dir}/mini-config",
            "OPENAI_API_KEY": ctx.endpoints.token,
            # litellm would otherwise fetch its price map from the internet at import.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }

    def overrides(self, ctx: HarnessContext) -> dict[str, Any]:
        c = self.config
        kwargs = {"api_base": ctx.endpoints.openai_base_url, "api_key": ctx.endpoints.token}
        if c.max_output_tokens:
            kwargs["max_tokens"] = c.max_output_tokens
        kwargs.update(c.model_kwargs)
        cfg: dict[str, Any] = {
            "agent": {"mode": "yolo", "step_limit": c.step_limit, "cost_limit": 0},
            "model": {
                "model_name": self.model_name,
                "cost_tracking": "ignore_errors",
                "model_kwargs": kwargs,
            },
        }
        cfg.update(c.extra_config)
        return cfg

    async def write_config(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        await write_sandbox_file(sandbox, self.overrides_path, yaml_dumps(self.overrides(ctx)))

    def command(self, ctx: HarnessContext) -> list[str]:
        return [
            self.executable,
            "-y",
            "--exit-immediately",
            "-m",
            self.model_name,
            "-c",
            self.config.base_config,
            "-c",
            self.overrides_path,
            "-t",
            ctx.prompt,
            "-o",
            self.traj_path,
        ]

    def version_command(self) -> str:
        # `mini --version` is not an option; the banner of `--help` names the version.
        return f"MSWEA_CONFIGURED=true {self.executable} --help 2>&1 | head -n 3"

    def log_specs(self) -> list[LogSpec]:
        return [LogSpec(path=self.traj_path, kind="trajectory")]

    async def parse_result(
        self, sandbox: Sandbox, ctx: HarnessContext, result: AgentResult
    ) -> AgentResult:
        raw = await read_sandbox_text(sandbox, self.traj_path)
        if raw:
            info = json.loads(raw).get("info", {})
            result.details["exit_status"] = info.get("exit_status")
            result.details["api_calls"] = (info.get("model_stats") or {}).get("api_calls")
            sub = info.get("submission")
            result.final_message = sub if isinstance(sub, str) and sub else None
        return result

    def scene_rules(self) -> list[SceneRule]:
        # mini makes only main-loop calls (one bash tool, no auxiliary requests).
        return [PROBE_RULE]
