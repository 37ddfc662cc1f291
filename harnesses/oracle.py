"""The oracle: runs a task's own reference solution instead of an agent.

Why: before a dataset is trained on, every task should be solvable in our sandboxes
with its own verifier — the oracle's reward is 1 where the dataset is sound. It never
calls an LLM. The task loader (Harbor's `solution/`) puts the solution into this
harness's config; setup places it at /solution (only for this harness: an agent never
sees it), and run executes `bash /solution/solve.sh` in the workdir like an agent's
process (same budget, kill and output tails).
"""

from __future__ import annotations

import hashlib

from pydantic import Field

from harnesses.base import (
    PROBE_RULE,
    CliHarness,
    HarnessConfig,
    HarnessContext,
    HarnessSetupError,
)
from sandboxes.base import SOLUTION_DIR, Sandbox
from schemas.scenes import SceneRule
from schemas.workspace import SandboxFile

#: The script the oracle runs (the solution goes to the sandbox's empty SOLUTION_DIR).
SOLVE_SCRIPT = f"{SOLUTION_DIR}/solve.sh"


class OracleConfig(HarnessConfig):
    #: The solution's files, absolute paths under /solution (written by the task loader;
    #: none: setup fails, the task was not loaded for the oracle).
    solution_files: list[SandboxFile] = Field(default_factory=list)
    #: Env of the solution script (Harbor's `[solution].env`).
    solution_env: dict[str, str] = Field(default_factory=dict)


class OracleHarness(CliHarness):
    name = "oracle"
    binary = "bash"
    install_hint = "an image with bash"
    config_model = OracleConfig
    config: OracleConfig

    def __init__(self, config: OracleConfig | dict | None = None) -> None:  # type: ignore[type-arg]
        super().__init__(config)
        paths = [f.path for f in self.config.solution_files]
        outside = [p for p in paths if not p.startswith(f"{SOLUTION_DIR}/")]
        if outside:
            raise ValueError(f"oracle: solution files must lie under {SOLUTION_DIR}/: {outside}")
        digest = hashlib.sha256()
        for f in sorted(self.config.solution_files, key=lambda f: f.path):
            digest.update(f"{f.path}\0{f.mode:o}\0".encode() + f.data() + b"\0")
        #: Lineage: which solution ran.
        self.solution_version = f"oracle-{digest.hexdigest()[:12]}"

    async def write_config(self, sandbox: Sandbox, ctx: HarnessContext) -> None:
        if SOLVE_SCRIPT not in {f.path for f in self.config.solution_files}:
            raise HarnessSetupError(
                f"oracle: the task carries no {SOLVE_SCRIPT} (load a dataset with the oracle "
                "harness so its solution comes with each task)"
            )
        for f in self.config.solution_files:
            await sandbox.put_file(f.path, f.data(), mode=f.mode)

    def agent_env(self, ctx: HarnessContext) -> dict[str, str]:
        return dict(self.config.solution_env)

    def command(self, ctx: HarnessContext) -> list[str]:
        return [self.executable, SOLVE_SCRIPT]

    async def probe_version(self, sandbox: Sandbox) -> str:
        return self.solution_version

    def scene_rules(self) -> list[SceneRule]:
        return [PROBE_RULE]
