"""Unit tests: each harness writes a config its agent accepts, with the right values.

No sandbox, no agent: a `FakeSandbox` records commands and keeps written files in a
dict, and the tests parse what was written (TOML / YAML / JSON) like the agent would.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from harnesses.base import (
    AgentHarness,
    CliHarness,
    GatewayEndpoints,
    HarnessContext,
    HarnessSetupError,
    rebase_url,
)
from harnesses.claude_code import ClaudeCodeHarness
from harnesses.codex import KEY_ENV, CodexHarness
from harnesses.command import CommandHarness
from harnesses.config_files import toml_dumps
from harnesses.hermes import HERMES_MIN_CONTEXT, HermesHarness
from harnesses.mini_swe_agent import MiniSweAgentHarness
from harnesses.registry import get_harness, harness_names
from sandboxes.base import ExecResult
from schemas.tasks import HarnessSpec, RolloutTask
from tests.fixtures.fake_sandbox import FakeSandbox

TOKEN = "sess-token-123"


def make_ctx(workdir: str = "/workspace", prompt: str = "fix the bug") -> HarnessContext:
    return HarnessContext(
        rollout_id="r-1",
        task=RolloutTask(
            task_id="t-1", prompt=prompt, harness=HarnessSpec(name="command", budget_s=60)
        ),
        endpoints=GatewayEndpoints.inside_sandbox(
            token=TOKEN,
            openai_base_url="http://10.1.2.3:8000/v1",
            anthropic_base_url="http://10.1.2.3:8000",
            sandbox_base_url="http://127.0.0.1:18080",
        ),
        workdir=workdir,
    )


async def setup(h: CliHarness, **kw: Any) -> FakeSandbox:
    sb = FakeSandbox(**kw)
    await h.setup(sb, make_ctx())
    return sb


# --------------------------------------------------------------------------- urls


@pytest.mark.parametrize(
    ("url", "base", "want"),
    [
        ("http://10.0.0.5:8000/v1", "http://127.0.0.1:18080", "http://127.0.0.1:18080/v1"),
        ("http://10.0.0.5:8000", "http://127.0.0.1:18080", "http://127.0.0.1:18080"),
        ("http://h:1/v1/", None, "http://h:1/v1"),
        ("http://h:1/v1", "https://gw.example/s/abc", "https://gw.example/s/abc/v1"),
    ],
)
def test_rebase_url_keeps_path_and_takes_origin(url: str, base: str | None, want: str) -> None:
    assert rebase_url(url, base) == want


# --------------------------------------------------------------------------- codex


async def test_codex_config_toml_points_custom_responses_provider_at_gateway() -> None:
    h = CodexHarness({"model": "tiny", "context_window": 16384})
    sb = await setup(h)
    path = "/home/agent/.rollout-agent/codex/config.toml"
    cfg = tomllib.loads(sb.text(path))
    assert cfg["model"] == "tiny"
    provider = cfg["model_providers"][cfg["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:18080/v1"
    assert provider["wire_api"] == "responses"
    assert provider["name"].lower() != "openai"  # would switch on WebSockets
    assert cfg["model_context_window"] == 16384
    assert cfg["model_auto_compact_token_limit"] < 16384
    assert cfg["approval_policy"] == "never"
    assert cfg["sandbox_mode"] == "danger-full-access"
    assert cfg["analytics"] == {"enabled": False}
    # The key is read from the env var the provider names.
    assert provider["env_key"] == KEY_ENV and h.env[KEY_ENV] == TOKEN
    assert h.env["CODEX_HOME"] == "/home/agent/.rollout-agent/codex"
    argv = h.command(make_ctx())
    assert argv[:3] == ["codex", "exec", "--skip-git-repo-check"]
    assert "--dangerously-bypass-approvals-and-sandbox" in argv and "--json" in argv
    assert argv[-2:] == ["--", "fix the bug"]


def test_toml_writer_round_trips_nested_tables_and_escapes() -> None:
    data = {
        "s": 'quote " back\\ nl\n uni ü',
        "n": 3,
        "f": 0.5,
        "b": True,
        "l": ["a", 1],
        "t": {"x": {"y": 1, "headers": {"X-A": "1"}}},
        "e": {},
    }
    assert tomllib.loads(toml_dumps(data)) == data


# --------------------------------------------------------------------------- claude code


async def test_claude_code_env_and_settings() -> None:
    h = ClaudeCodeHarness({"model": "tiny", "context_window": 32768, "max_output_tokens": 2048})
    sb = await setup(h)
    settings = json.loads(sb.text("/home/agent/.rollout-agent/home/.claude/settings.json"))
    for env in (h.env, settings["env"]):
        assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"  # no /v1
        assert env["ANTHROPIC_API_KEY"] == TOKEN
        assert env["ANTHROPIC_MODEL"] == "tiny"
        assert env["IS_SANDBOX"] == "1"
        assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
        assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
        assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "2048"
        assert env["CLAUDE_CODE_GATEWAY_HINT_HEADERS"] == "1"
    assert settings["permissions"]["defaultMode"] == "bypassPermissions"
    assert h.env["HOME"] == "/home/agent/.rollout-agent/home"
    argv = h.command(make_ctx())
    assert argv[:3] == ["claude", "-p", "fix the bug"]
    assert "--dangerously-skip-permissions" in argv
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv


async def test_claude_code_bearer_auth_option() -> None:
    h = ClaudeCodeHarness({"auth": "bearer"})
    await setup(h)
    assert h.env["ANTHROPIC_AUTH_TOKEN"] == TOKEN and "ANTHROPIC_API_KEY" not in h.env


# --------------------------------------------------------------------------- hermes


@pytest.mark.parametrize(("window", "want"), [(32768, HERMES_MIN_CONTEXT), (131072, 131072)])
async def test_hermes_config_yaml(window: int, want: int) -> None:
    h = HermesHarness({"model": "tiny", "context_window": window, "max_output_tokens": 1024})
    sb = await setup(h)
    cfg = yaml.safe_load(sb.text("/home/agent/.rollout-agent/hermes/config.yaml"))
    m = cfg["model"]
    assert m["provider"] == "custom"
    assert m["base_url"] == "http://127.0.0.1:18080/v1"
    assert not m["base_url"].rstrip("/").endswith("/anthropic")
    assert m["default"] == "tiny" and m["api_key"] == TOKEN
    assert m["api_mode"] == "chat_completions"
    assert m["context_length"] == want  # never below Hermes' hard 64k floor
    assert m["max_tokens"] == 1024
    assert h.env["HERMES_HOME"] == "/home/agent/.rollout-agent/hermes"
    # No runtime pip installs in a sandbox without network (they stall startup).
    assert cfg["security"]["allow_lazy_installs"] is False
    assert h.env["HERMES_DISABLE_LAZY_INSTALLS"] == "1"
    assert h.command(make_ctx())[:3] == ["hermes", "-z", "fix the bug"]


# --------------------------------------------------------------------------- mini


async def test_mini_swe_agent_overrides_and_command() -> None:
    h = MiniSweAgentHarness({"model": "tiny", "step_limit": 7, "model_kwargs": {"temperature": 0}})
    sb = await setup(h)
    cfg = yaml.safe_load(sb.text("/home/agent/.rollout-agent/rollout-mini.yaml"))
    assert cfg["model"]["model_name"] == "openai/tiny"
    kw = cfg["model"]["model_kwargs"]
    assert kw["api_base"] == "http://127.0.0.1:18080/v1" and kw["api_key"] == TOKEN
    assert kw["temperature"] == 0
    assert cfg["model"]["cost_tracking"] == "ignore_errors"
    assert cfg["agent"]["step_limit"] == 7 and cfg["agent"]["mode"] == "yolo"
    assert h.env["MSWEA_CONFIGURED"] == "true"
    assert h.env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert h.env["OPENAI_API_KEY"] == TOKEN
    argv = h.command(make_ctx())
    assert argv[:3] == ["mini", "-y", "--exit-immediately"]
    # The packaged default config first, then ours (mini merges them in order).
    cs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert cs == ["mini.yaml", "/home/agent/.rollout-agent/rollout-mini.yaml"]
    assert argv[argv.index("-m") + 1] == "openai/tiny"
    assert argv[argv.index("-t") + 1] == "fix the bug"


# --------------------------------------------------------------------------- command


async def test_command_template_quotes_placeholders_and_sets_env() -> None:
    h = CommandHarness(
        {
            "command": "agent --task {{prompt}} --url {{ openai_base_url }} --m {{model}}",
            "env_template": {"MY_KEY": "{{api_key}}"},
            "model": "tiny",
        }
    )
    await setup(h)
    ctx = make_ctx(prompt='it\'s a "prompt"; rm -rf /')
    argv = h.command(ctx)
    assert argv[:2] == ["/bin/sh", "-c"]
    # The shell sees the prompt as one word, exactly as given.
    words = shlex.split(argv[2])
    assert words == [
        "agent",
        "--task",
        ctx.prompt,
        "--url",
        "http://127.0.0.1:18080/v1",
        "--m",
        "tiny",
    ]
    assert h.env["MY_KEY"] == TOKEN
    assert h.env["OPENAI_BASE_URL"] == "http://127.0.0.1:18080/v1"
    assert h.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"
    assert h.harness_version.startswith("command-")


def test_command_unknown_placeholder_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown placeholder"):
        CommandHarness({"command": "agent {{promt}}"})


# --------------------------------------------------------------------------- shared


async def test_setup_fails_clearly_when_the_agent_is_missing() -> None:
    with pytest.raises(HarnessSetupError, match="install_agents"):
        await setup(CodexHarness({}), missing={"codex"})


async def test_version_is_probed_from_the_agent() -> None:
    def handler(cmd: str, kw: Mapping[str, Any]) -> ExecResult | None:
        if "--version" in cmd:
            return ExecResult(exit_code=0, stdout="codex-cli 0.171.0\n")
        return None

    h = CodexHarness({})
    await setup(h, handler=handler)
    assert h.harness_version == "0.171.0"


async def test_state_dir_avoids_a_workspace_that_is_home() -> None:
    h = HermesHarness({})
    sb = FakeSandbox(workdir="/home/agent")
    await h.setup(sb, make_ctx(workdir="/home/agent"))
    assert h.state_dir == "/tmp/rollout-agent"


def test_registry_builds_every_builtin_harness() -> None:
    assert set(harness_names()) >= {"claude_code", "codex", "hermes", "mini_swe_agent", "command"}
    for name in harness_names():
        cfg = {"command": "true"} if name == "command" else {}
        h = get_harness(name, cfg)
        assert isinstance(h, AgentHarness) and h.name == name
    with pytest.raises(KeyError, match="unknown harness"):
        get_harness("nope")
    with pytest.raises(ValueError):
        get_harness("codex", {"no_such_option": 1})


async def test_run_reports_exit_tails_and_budget_kill() -> None:
    def handler(cmd: str, kw: Mapping[str, Any]) -> ExecResult | None:
        if cmd.startswith("exec "):
            assert kw["timeout"] == 60 and kw["cwd"] == "/workspace"
            assert cmd.endswith("</dev/null")
            return ExecResult(exit_code=137, stdout="x" * 50, stderr="bye", timed_out=True)
        return None

    h = CommandHarness({"command": "sleep 1000", "tail_bytes": 10})
    sb = FakeSandbox(handler)
    ctx = make_ctx()
    await h.setup(sb, ctx)
    r = await h.run(sb, ctx)
    assert r.timed_out and r.exit_code == 137 and not r.ok
    assert r.stdout_tail == "x" * 10 and r.stdout_bytes == 50 and r.stderr_tail == "bye"
