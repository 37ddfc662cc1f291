"""The harness protocol, its boundary models, and the shared CLI-agent runner.

Why this shape: every supported agent is a CLI that we cannot modify. What differs per
agent is only *data* — which config files to write, which env vars and argv to use,
where it keeps its transcripts, and how its LLM calls are classified into scenes. The
process handling (budget, kill, output tails, version probe) is the same for all, so
it lives once in `CliHarness`; a new agent is a small subclass and touches no backend.

A harness sees only a `Sandbox` (exec + files) and `GatewayEndpoints` (URLs as seen
from *inside* the sandbox + the session token). It never imports gateway internals.
"""

from __future__ import annotations

import abc
import asyncio
import re
import shlex
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from sandboxes.base import OutputChunk, Sandbox, SandboxError, SandboxNotFound
from schemas.base import StrictModel
from schemas.outcome import AgentResult, LogFile, LogSpec
from schemas.scenes import SceneConfig, SceneRule
from schemas.tasks import RolloutTask

__all__ = [
    "AgentHarness",
    "CliHarness",
    "GatewayEndpoints",
    "HarnessConfig",
    "HarnessContext",
    "HarnessSetupError",
    "rebase_url",
    "write_sandbox_file",
]

#: Probe rule shared by every profile: `max_tokens <= 1` calls are health/quota probes.
PROBE_RULE = SceneRule(scene="probe", max_tokens_at_most=1)


class HarnessSetupError(RuntimeError):
    """The agent cannot be started (binary missing, config not writable...)."""


# --------------------------------------------------------------------------- models


class GatewayEndpoints(StrictModel):
    """How the agent reaches its Gateway session, as seen from inside the sandbox."""

    token: str = Field(min_length=1)
    #: OpenAI-style base, ends in `/v1` (Chat Completions, Responses).
    openai_base_url: str
    #: Anthropic-style base: the host root, *without* `/v1` (the SDK appends it).
    anthropic_base_url: str
    session_id: str | None = None

    @classmethod
    def inside_sandbox(
        cls,
        *,
        token: str,
        openai_base_url: str,
        anthropic_base_url: str,
        sandbox_base_url: str | None,
        session_id: str | None = None,
    ) -> GatewayEndpoints:
        """Rebase the Gateway's host-side URLs onto the sandbox's loopback forwarder."""
        return cls(
            token=token,
            openai_base_url=rebase_url(openai_base_url, sandbox_base_url),
            anthropic_base_url=rebase_url(anthropic_base_url, sandbox_base_url),
            session_id=session_id,
        )


def rebase_url(url: str, base: str | None) -> str:
    """Keep `url`'s path and query, take scheme/host/port (and any path prefix) from
    `base`. The sandbox forwarder passes paths through unchanged, so a session URL such
    as ``http://10.0.0.5:8000/v1`` becomes ``http://127.0.0.1:18080/v1`` inside."""
    if not base:
        return url.rstrip("/")
    u, b = urlsplit(url), urlsplit(base)
    path = b.path.rstrip("/") + "/" + u.path.lstrip("/")
    return urlunsplit((b.scheme, b.netloc, path.rstrip("/") or "", u.query, "")).rstrip("/")


class HarnessContext(BaseModel):
    """Per-run inputs a harness needs besides its own config: the task itself plus
    where this run happens."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    task: RolloutTask
    endpoints: GatewayEndpoints
    #: Directory the agent works in (inside the sandbox).
    workdir: str
    #: Host directory for the full stdout/stderr of the agent (None: keep tails only).
    output_dir: str | None = None

    @property
    def prompt(self) -> str:
        return self.task.prompt

    @property
    def budget_s(self) -> float:
        """Wall-clock budget for the agent process; it is killed at this point."""
        return self.task.harness.budget_s


class HarnessConfig(StrictModel):
    """Options common to every harness; subclasses add agent-specific ones."""

    #: Model name the agent requests (the Gateway session decides what actually serves).
    model: str = "policy"
    #: Context window to announce to agents that cannot learn it from the server.
    context_window: int = Field(default=32768, gt=0)
    #: Cap on output tokens per call where the agent lets us set one.
    max_output_tokens: int | None = Field(default=None, gt=0)
    #: Agent home/config/log area inside the sandbox. Default: `$HOME/.rollout-agent`
    #: of the sandbox user — outside the workspace (never in the diff), writable in
    #: every backend, and not under /tmp (Codex refuses helper binaries there) — or
    #: /tmp/rollout-agent when the workspace is HOME itself.
    state_dir: str | None = None
    #: Path of the agent executable; default: looked up on PATH.
    executable: str | None = None
    #: Extra PATH entries (e.g. the bin dir of scripts/install_agents.sh).
    path_prefix: list[str] = Field(default_factory=list)
    #: Extra env vars and CLI args (applied last, so they can override ours).
    env: dict[str, str] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    #: Extra seconds after the budget before we stop waiting for the backend's kill.
    kill_grace_s: float = Field(default=15.0, ge=0)
    #: How much of stdout/stderr to keep in the result.
    tail_bytes: int = Field(default=16384, ge=0)
    #: Extra scene rules for this task, tried before the harness profile.
    scene_rules: list[SceneRule] = Field(default_factory=list)


# --------------------------------------------------------------------------- protocol


class AgentHarness(abc.ABC):
    """Setup / run / cleanup of one agent in one sandbox (one instance per rollout)."""

    name: ClassVar[str]
    config_model: ClassVar[type[HarnessConfig]] = HarnessConfig

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        if config is None:
            config = {}
        if not isinstance(config, self.config_model):
            config = self.config_model.model_validate(dict(config))
        self.config = config
        self.harness_version = "unknown"

    @abc.abstractmethod
    async def setup(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        """Write the agent's config into the sandbox and check it can start."""

    @abc.abstractmethod
    async def run(self, sandbox: Sandbox, ctx: HarnessContext) -> AgentResult:
        """Run the agent to completion or until its budget; never raises for a bad exit."""

    async def cleanup(self, sandbox: Sandbox) -> None:
        """Undo setup side effects that outlive the sandbox (none by default)."""
        return None

    @abc.abstractmethod
    def scene_rules(self) -> list[SceneRule]:
        """This agent's scene profile (tried after task rules, before the generic one)."""

    def scene_config(self) -> SceneConfig:
        """Scene policy to send with `POST /sessions` for this agent (data only)."""
        return SceneConfig(profile="generic", rules=[*self.config.scene_rules, *self.scene_rules()])

    def log_specs(self) -> list[LogSpec]:
        """Where this agent keeps its own transcripts/logs inside the sandbox."""
        return []


# --------------------------------------------------------------------------- helpers


async def write_sandbox_file(
    sandbox: Sandbox, path: str, data: str | bytes, mode: int = 0o644
) -> None:
    """Write a file *as the sandbox user* (exec + stdin), creating parent dirs.

    Why not `put_file`: archive extraction may create files owned by root, and agents
    rewrite their own config files (Hermes migrates config.yaml, Claude Code updates its
    settings), which must then stay writable by the unprivileged sandbox user.
    """
    raw = data.encode() if isinstance(data, str) else data
    q = shlex.quote(path)
    parent = shlex.quote(str(PurePosixPath(path).parent))
    res = await sandbox.exec(
        f"mkdir -p {parent} && cat > {q} && chmod {mode:o} {q}", stdin=raw, timeout=60
    )
    if res.exit_code != 0:
        raise HarnessSetupError(f"cannot write {path} in the sandbox: {res.stderr.strip()}")


class _Tail:
    """Keeps the last `limit` bytes of a stream plus the total byte count."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


_VERSION_RE = re.compile(r"\d+\.\d+\.\d+(?:[-.+][0-9A-Za-z.]+)?")


class CliHarness(AgentHarness):
    """Runs a CLI agent: env + config files in setup, one budgeted process in run."""

    #: Executable name looked up on PATH when `config.executable` is not set.
    binary: ClassVar[str]
    #: Pinned version this harness was written against (schemas/agent_versions.py).
    pinned_version: ClassVar[str] = "unknown"
    #: How to install the agent when it is missing (shown in the error).
    install_hint: ClassVar[str] = "scripts/install_agents.sh"

    def __init__(self, config: HarnessConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.env: dict[str, str] = {}
        self.executable = self.config.executable or self.binary
        self.state_dir = self.config.state_dir or "/tmp/rollout-agent"

    # --- what subclasses provide ---------------------------------------------

    @property
    def home(self) -> str:
        """HOME for the agent: a fresh dir under the state dir (no host/user config)."""
        return f"{self.state_dir}/home"

    def resolve_state_dir(self, sandbox: Sandbox, ctx: HarnessContext) -> str:
        if self.config.state_dir:
            return self.config.state_dir
        home = (sandbox.env.get("HOME") or "").rstrip("/")
        work = ctx.workdir.rstrip("/")
        if home and work != home and not home.startswith(work + "/"):
            return f"{home}/.rollout-agent"
        return "/tmp/rollout-agent"

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        """Agent-specific env (gateway URL, key, model, quiet/telemetry switches)."""
        return {}

    async def write_config(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        """Write the agent's config files (default: none)."""
        return None

    @abc.abstractmethod
    def command(self, ctx: HarnessContext) -> list[str]:
        """argv of the non-interactive run (without `config.args`)."""

    async def parse_result(
        self, sandbox: Sandbox, ctx: HarnessContext, result: AgentResult
    ) -> AgentResult:
        """Fill `final_message`/`details` from the agent's own output (default: as is)."""
        return result

    def version_command(self) -> str:
        return f"{shlex.quote(self.executable)} --version"

    # --- shared machinery ------------------------------------------------------

    def build_env(self, sandbox: Sandbox, ctx: HarnessContext) -> dict[str, str]:
        base_path = sandbox.env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        path = (
            ":".join([*self.config.path_prefix, base_path])
            if self.config.path_prefix
            else base_path
        )
        env = {
            "HOME": self.home,
            "PATH": path,
            "ROLLOUT_ID": ctx.rollout_id,
            # Quiet, non-interactive, no colour codes in the tails.
            "NO_COLOR": "1",
            "TERM": "dumb",
            "CI": "1",
            "PYTHONUNBUFFERED": "1",
        }
        env.update(self.agent_env(ctx))
        env.update(self.config.env)
        return env

    async def setup(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        self.state_dir = self.resolve_state_dir(sandbox, ctx)
        self.env = self.build_env(sandbox, ctx)
        res = await sandbox.exec(
            f"mkdir -p {shlex.quote(self.home)} && command -v {shlex.quote(self.executable)}",
            env=self.env,
            timeout=60,
        )
        if res.exit_code != 0:
            raise HarnessSetupError(
                f"{self.name}: agent executable {self.executable!r} not found in the sandbox "
                f"(PATH={self.env['PATH']}); install it with {self.install_hint}"
            )
        await self.write_config(sandbox, ctx)
        await write_sandbox_file(sandbox, f"{self.state_dir}/prompt.txt", ctx.prompt)
        self.harness_version = await self.probe_version(sandbox)

    async def probe_version(self, sandbox: Sandbox) -> str:
        """The agent's own `--version` (lineage), falling back to the pinned version."""
        try:
            res = await sandbox.exec(self.version_command(), env=self.env, timeout=60)
        except SandboxError:
            return f"{self.pinned_version}?"
        m = _VERSION_RE.search(res.stdout + " " + res.stderr)
        return m.group(0) if res.exit_code == 0 and m else f"{self.pinned_version}?"

    async def run(self, sandbox: Sandbox, ctx: HarnessContext) -> AgentResult:
        argv = [*self.command(ctx), *self.config.args]
        # `exec` so the budget kill hits the agent itself; stdin from /dev/null because
        # some CLIs (codex exec) otherwise wait for more input on a non-tty stdin.
        shell_cmd = f"exec {shlex.join(argv)} </dev/null"
        out, err = _Tail(self.config.tail_bytes), _Tail(self.config.tail_bytes)
        files: dict[str, Any] = {}
        if ctx.output_dir:
            Path(ctx.output_dir).mkdir(parents=True, exist_ok=True)
            files = {
                s: open(Path(ctx.output_dir) / f"agent.{s}.log", "wb")  # noqa: SIM115
                for s in ("stdout", "stderr")
            }

        def on_output(chunk: OutputChunk) -> None:
            (out if chunk.stream == "stdout" else err).add(chunk.data)
            if files:
                files[chunk.stream].write(chunk.data)

        t0 = time.monotonic()
        exit_code: int | None = None
        timed_out = oom = False
        try:
            async with asyncio.timeout(ctx.budget_s + self.config.kill_grace_s):
                res = await sandbox.exec(
                    shell_cmd,
                    env=self.env,
                    cwd=ctx.workdir,
                    timeout=ctx.budget_s,
                    on_output=on_output,
                    max_output_bytes=max(self.config.tail_bytes, 1),
                )
            exit_code, timed_out, oom = res.exit_code, res.timed_out, res.oom_killed
            if not out.total and res.stdout:  # backend without streaming
                out.add(res.stdout.encode())
            if not err.total and res.stderr:
                err.add(res.stderr.encode())
        except TimeoutError:
            timed_out = True
        finally:
            for f in files.values():
                f.close()
        duration = time.monotonic() - t0
        # A kill at the budget shows as a signal exit (or no exit code at all).
        if duration >= ctx.budget_s and (exit_code is None or exit_code >= 128):
            timed_out = True
        result = AgentResult(
            harness=self.name,
            harness_version=self.harness_version,
            exit_code=exit_code,
            duration_s=round(duration, 3),
            timed_out=timed_out,
            oom_killed=oom,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            stdout_bytes=out.total,
            stderr_bytes=err.total,
            logs=[
                LogFile(
                    kind=f"agent_{s}", local_path=f.name, size=(out if s == "stdout" else err).total
                )
                for s, f in files.items()
            ],
        )
        try:
            return await self.parse_result(sandbox, ctx, result)
        except (SandboxError, ValueError, KeyError, OSError) as e:
            result.details["parse_error"] = repr(e)
            return result


async def read_sandbox_text(sandbox: Sandbox, path: str) -> str | None:
    """A small text file from the sandbox, or None if it does not exist."""
    try:
        return (await sandbox.get_file(path)).decode("utf-8", errors="replace")
    except (SandboxNotFound, SandboxError, FileNotFoundError):
        return None
