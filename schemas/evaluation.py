"""The task's success check (`EvaluationSpec`) and what checking it produced.

The environment contract is data: shell commands (e.g. a test suite), scripts (which
may print their own reward as JSON), and expected files with content. Each check gives a
score; the spec's aggregation gives the reward. It lives with the task contract so a
malformed check is rejected when the task file is read, not inside a sandbox later.
`reward_fn_version` hashes the spec plus `SCORING_VERSION`, so every sample names the
exact check that produced its reward.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from schemas.base import StrictModel
from schemas.workspace import SandboxFile, absolute_dir, full_commit

#: Bump when the scoring rules of the `evaluate` hook change meaning.
SCORING_VERSION = "4"


class _CheckBase(StrictModel):
    name: str | None = None
    weight: float = Field(default=1.0, ge=0)
    timeout_s: float = Field(default=300.0, gt=0)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class CommandCheck(_CheckBase):
    """Passes when the shell command exits with one of `pass_exit_codes`."""

    kind: Literal["command"] = "command"
    command: str
    pass_exit_codes: list[int] = Field(default_factory=lambda: [0])
    #: Exit codes meaning "the evaluator itself is broken" (126/127: not executable /
    #: not found; add e.g. 2-5 for pytest's usage/internal errors).
    error_exit_codes: list[int] = Field(default_factory=lambda: [126, 127])


class ScriptCheck(_CheckBase):
    """A script written into the sandbox and run with `interpreter`.

    `reward_from="exit_code"`: like a command check. `"stdout_json"`: the last stdout
    line is ``{"reward": float, "step_rewards": [...]?}``; a non-zero exit or a bad line
    is an evaluator error.
    """

    kind: Literal["script"] = "script"
    script: str
    interpreter: str = "/bin/sh"
    reward_from: Literal["exit_code", "stdout_json"] = "exit_code"
    pass_exit_codes: list[int] = Field(default_factory=lambda: [0])
    error_exit_codes: list[int] = Field(default_factory=lambda: [126, 127])


class FileCheck(_CheckBase):
    """Expectations on one file (path relative to the workdir unless absolute)."""

    kind: Literal["file"] = "file"
    path: str
    exists: bool = True
    #: Whole-content match (compared after stripping trailing whitespace when `strip`).
    equals: str | None = None
    contains: list[str] = Field(default_factory=list)
    regex: str | None = None
    strip: bool = True


def valid_reward_range(v: tuple[float, float]) -> tuple[float, float]:
    """`v` if it is two finite numbers, low < high; else ValueError."""
    low, high = v
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"reward_range {list(v)} must be two finite numbers, low < high")
    return v


#: The closed range every reward of a task lies in (a verifier's reward outside it is
#: the agent's doing).
RewardRange = Annotated[tuple[float, float], AfterValidator(valid_reward_range)]


class VerifierEvidence(StrictModel):
    """A run of a task's verifier the agent could not have interfered with (the task's
    own solution, `rollout run --harness oracle`), that finished within its timeout and
    wrote a reward in range. Recorded per task content, image and backend
    (`task_formats.verifier_evidence`); with it, a verifier that writes no reward after
    an agent ran fails by the agent's doing."""

    #: The oracle rollout that showed it.
    rollout_id: str = Field(min_length=1)
    reward: float
    #: The image the oracle's sandbox ran, when it is the same on every host (a pulled
    #: image's id); a sandbox running another image is not covered. None: any (built).
    image_digest: str | None = None
    recorded_at: str = ""


class RewardFileCheck(_CheckBase):
    """A verifier that writes its own reward to a file (Harbor's contract).

    `command` runs (cwd: the workdir unless `cwd`); then `reward_dir/reward.txt` (one
    number) or else `reward_dir/reward.json` (an object of numeric metrics, `reward_key`
    the training reward) is the score, and the JSON's other metrics are recorded
    (`hooks.reward_file`). Anything in `reward_dir` before the run is removed first, so
    a file the agent planted cannot score. A reward outside `reward_range` is the
    agent's failure (reward 0). A missing, empty or non-numeric reward file is an
    evaluator error carrying the command's output tail — or the agent's failure when
    `shown_working` says the verifier gave a reward without the agent.
    """

    kind: Literal["reward_file"] = "reward_file"
    command: str = "bash /tests/test.sh"
    reward_dir: str = "/logs/verifier"
    reward_key: str = "reward"
    #: The user the verifier runs as; None: the sandbox's agent user.
    user: str | None = None
    #: The closed range every reward of the task lies in; outside it: the agent's doing.
    reward_range: RewardRange = (0.0, 1.0)
    #: Evidence the verifier works here without the agent (None: not shown).
    shown_working: VerifierEvidence | None = None

    @field_validator("reward_dir")
    @classmethod
    def _a_dir_of_its_own(cls, v: str) -> str:
        """It is emptied before the verifier runs: never the root, the check's cwd or
        above it, or the tests dir."""
        p = posixpath.normpath(v)
        if p in ("/", ".", "..", "/tests") or p.startswith(("/tests/", "../")):
            raise ValueError(
                f"reward_dir {v!r} would be emptied before the verifier runs, with what it "
                "holds; give the verifier a directory of its own (default /logs/verifier)"
            )
        return v


class SweBenchCheck(_CheckBase):
    """SWE-bench's resolved rule: the hidden test patch applied, the tests run and read.

    After the agent stopped, every file `test_patch` touches is set to its content at
    `base_commit` with the patch applied (the agent's edits to those files are dropped,
    files it planted where the patch creates one are replaced), and the test runner's
    configuration (every conftest.py, pytest/tox/setup.cfg/pyproject file and
    sitecustomize/usercustomize module in the repo) is set back to `base_commit`'s, the
    agent's extra ones removed; then `test_command` runs in `repo_path` without plugin
    autoloading or the cache provider, its verdict is read from pytest's JUnit report
    (or by the log parser named `log_parser` for another runner), and the check passes
    only when every `fail_to_pass` and `pass_to_pass` test passed. Each test's status is
    recorded (`CheckResult.tests`). `cwd` is not used: the tests run in `repo_path`.
    """

    kind: Literal["swebench"] = "swebench"
    timeout_s: float = Field(default=1800.0, gt=0)
    #: The repository's top directory in the sandbox (its `.git` holds `base_commit`).
    repo_path: str = "/testbed"
    base_commit: str
    #: A git diff adding the tests; never shown to the agent.
    test_patch: str = Field(min_length=1)
    #: Shell command run in `repo_path` (the test files already filled in).
    test_command: str = Field(min_length=1)
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    #: A test-log parser by name (`pytest`, `unittest`, or one registered by the user).
    #: With `pytest` the verdict comes from pytest's JUnit XML report, not the log.
    log_parser: str = Field(default="pytest", min_length=1)
    #: pytest plugins the test environment provides and the tests need, each given as
    #: ``-p NAME`` (a module such as ``xdist.plugin``, or on pytest >= 8.4 an entry-point
    #: name): the tests run with plugin autoloading off, so no other installed plugin
    #: loads (one the agent installed included).
    pytest_plugins: list[str] = Field(default_factory=list)

    @field_validator("base_commit")
    @classmethod
    def _full_commit(cls, v: str) -> str:
        return full_commit(v, "base_commit")

    @field_validator("repo_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return absolute_dir(v, "repo_path")

    @field_validator("pytest_plugins")
    @classmethod
    def _plugin_names(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not re.fullmatch(r"[A-Za-z_][\w.-]*", p)]
        if bad:
            raise ValueError(f"pytest_plugins: {bad} are not plugin or module names")
        return v

    @model_validator(mode="after")
    def _has_tests(self) -> SweBenchCheck:
        if not self.fail_to_pass and not self.pass_to_pass:
            raise ValueError("fail_to_pass and pass_to_pass are both empty: nothing to check")
        if not any(ln.startswith(("diff --git ", "--- ")) for ln in self.test_patch.splitlines()):
            raise ValueError("test_patch is not a diff (no 'diff --git' or '---' line)")
        return self


Check = Annotated[
    CommandCheck | ScriptCheck | FileCheck | RewardFileCheck | SweBenchCheck,
    Field(discriminator="kind"),
]


class EvaluationSpec(StrictModel):
    """The task's environment contract: how success is checked and scored."""

    checks: list[Check] = Field(min_length=1)
    #: Files placed just before evaluation (hidden tests the agent never saw).
    files: list[SandboxFile] = Field(default_factory=list)
    #: "all": 1.0 iff every check passed; "mean": weighted mean of scores; "sum".
    aggregate: Literal["all", "mean", "sum"] = "all"
    #: Reward at or above which the verdict is "pass".
    pass_threshold: float = 1.0
    #: Explicit reward-function version; default: a hash of this spec.
    version: str | None = None

    def reward_fn_version(self) -> str:
        if self.version:
            return self.version
        # The evidence a verifier works says nothing about how it scores.
        dump = self.model_dump(mode="json", exclude={"checks": {"__all__": {"shown_working"}}})
        blob = json.dumps(dump, sort_keys=True).encode()
        return f"eval{SCORING_VERSION}-{hashlib.sha256(blob).hexdigest()[:12]}"


class CheckVerdict(StrictModel):
    """A check's verdict and how it ran, without its per-test statuses: what a sample row
    and a viewer carry of it."""

    name: str
    kind: str
    passed: bool
    score: float
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    detail: str = ""


class CheckResult(CheckVerdict):
    #: Per test (a `swebench` check): PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS or
    #: MISSING (not in the test log).
    tests: dict[str, str] = Field(default_factory=dict)
    #: Where the verdict was read from, for a check that reads one ("reward.txt",
    #: "reward.json", "junit-xml", "log:pytest", …): which evidence a reward rests on.
    source: str | None = None


class EvaluationResult(StrictModel):
    """Outcome of the success check. `reward` is None exactly when status is eval_error.

    `agent_broke_sandbox`: a check could not be carried out and the sandbox shows damage
    the agent could have done (`damage` says what): reward 0, the agent's doing.
    """

    status: Literal["ok", "eval_error", "agent_broke_sandbox"]
    reward: float | None
    step_rewards: list[float] | None = None
    verdict: Literal["pass", "fail", "error"]
    checks: list[CheckResult] = Field(default_factory=list)
    reward_fn_version: str
    duration_s: float = 0.0
    error: str | None = None
    #: What the agent broke that the evaluation needed (status agent_broke_sandbox).
    damage: str | None = None
    #: Every numeric metric a verifier reported besides the reward (recorded per sample).
    metrics: dict[str, float] = Field(default_factory=dict)

    @property
    def problem(self) -> str | None:
        """Why the evaluation gave no earned reward, for the operator."""
        if self.status == "agent_broke_sandbox":
            return f"the agent broke its sandbox ({self.damage}); the check failed: {self.error}"
        if self.status == "eval_error":
            return self.error or "evaluator failed"
        return None
