"""`evaluate`: run the task's success check in the sandbox and turn it into reward(s).

The environment contract is data (`EvaluationSpec`): shell commands (e.g. a test
suite), scripts (which may print their own reward as JSON), and expected files with
content. Each check gives a score; the spec's aggregation gives the reward.

A *broken evaluator* is not a wrong answer: if a check cannot be carried out (command
not found, time-out, unparsable reward output, sandbox failure) the result is
`status="eval_error"` with `reward=None`, so a trainer never learns from a reward of 0
that the agent did not earn. `reward_fn_version` hashes the spec (plus this module's
scoring version), so samples say exactly which check produced their reward.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from typing import Annotated, Any, Literal

from pydantic import Field

from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import Sandbox, SandboxError, SandboxFile
from schemas.base import StrictModel

#: Bump when the scoring rules below change meaning.
SCORING_VERSION = "1"
_DETAIL_CHARS = 4000


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


Check = Annotated[CommandCheck | ScriptCheck | FileCheck, Field(discriminator="kind")]


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
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return f"eval{SCORING_VERSION}-{hashlib.sha256(blob).hexdigest()[:12]}"


class CheckResult(StrictModel):
    name: str
    kind: str
    passed: bool
    score: float
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    detail: str = ""


class EvaluationResult(StrictModel):
    """Outcome of the success check. `reward` is None exactly when status is eval_error."""

    status: Literal["ok", "eval_error"]
    reward: float | None
    step_rewards: list[float] | None = None
    verdict: Literal["pass", "fail", "error"]
    checks: list[CheckResult] = Field(default_factory=list)
    reward_fn_version: str
    duration_s: float = 0.0
    error: str | None = None


class EvaluatorError(RuntimeError):
    """The check could not be carried out (not: the agent's answer was wrong)."""


class EvaluateParams(StrictModel):
    #: Overrides the task's `evaluation` (normally the spec comes from the task).
    spec: EvaluationSpec | None = None


def _tail(text: str) -> str:
    return text[-_DETAIL_CHARS:]


async def _run_check(
    sandbox: Sandbox, check: CommandCheck | ScriptCheck | FileCheck, workdir: str, idx: int
) -> tuple[CheckResult, list[float] | None]:
    name = check.name or f"{check.kind}{idx}"
    cwd = check.cwd or workdir
    t0 = time.monotonic()
    if isinstance(check, FileCheck):
        path = check.path if check.path.startswith("/") else f"{cwd.rstrip('/')}/{check.path}"
        try:
            data: str | None = (await sandbox.get_file(path)).decode("utf-8", errors="replace")
        except (SandboxError, FileNotFoundError):
            data = None
        problems: list[str] = []
        if data is None:
            if check.exists:
                problems.append(f"{check.path} does not exist")
        elif not check.exists:
            problems.append(f"{check.path} exists")
        else:
            text = data.rstrip() if check.strip else data
            if check.equals is not None:
                want = check.equals.rstrip() if check.strip else check.equals
                if text != want:
                    problems.append(f"content differs (got {text[:200]!r})")
            problems += [f"missing {s!r}" for s in check.contains if s not in data]
            if check.regex is not None and re.search(check.regex, data, re.MULTILINE) is None:
                problems.append(f"no match for /{check.regex}/")
        ok = not problems
        return CheckResult(
            name=name,
            kind=check.kind,
            passed=ok,
            score=1.0 if ok else 0.0,
            duration_s=round(time.monotonic() - t0, 3),
            detail="; ".join(problems) or "ok",
        ), None

    if isinstance(check, ScriptCheck):
        script_path = f"/tmp/rollout-eval-{idx}-{int(time.time() * 1000)}"
        await sandbox.put_file(script_path, check.script, mode=0o755)
        cmd = f"{check.interpreter} {shlex.quote(script_path)}"
    else:
        cmd = check.command
    try:
        res = await sandbox.exec(cmd, cwd=cwd, env=check.env or None, timeout=check.timeout_s)
    except SandboxError as e:
        raise EvaluatorError(f"check {name}: sandbox error {e!r}") from e
    output = _tail(res.stdout + ("\n" + res.stderr if res.stderr else ""))
    if res.timed_out:
        raise EvaluatorError(f"check {name} timed out after {check.timeout_s}s: {output}")
    if res.exit_code in check.error_exit_codes:
        raise EvaluatorError(f"check {name} could not run (exit {res.exit_code}): {output}")
    step: list[float] | None = None
    if isinstance(check, ScriptCheck) and check.reward_from == "stdout_json":
        if res.exit_code != 0:
            raise EvaluatorError(f"reward script {name} failed (exit {res.exit_code}): {output}")
        lines = [ln for ln in res.stdout.strip().splitlines() if ln.strip()]
        try:
            payload: Any = json.loads(lines[-1])
            score = float(payload["reward"])
            if payload.get("step_rewards") is not None:
                step = [float(x) for x in payload["step_rewards"]]
        except (IndexError, ValueError, KeyError, TypeError) as e:
            raise EvaluatorError(f"reward script {name} printed no reward JSON: {output}") from e
        passed = score >= 1.0
    else:
        passed = res.exit_code in check.pass_exit_codes
        score = 1.0 if passed else 0.0
    return CheckResult(
        name=name,
        kind=check.kind,
        passed=passed,
        score=score,
        exit_code=res.exit_code,
        duration_s=round(time.monotonic() - t0, 3),
        detail=output,
    ), step


async def evaluate(sandbox: Sandbox, spec: EvaluationSpec, workdir: str) -> EvaluationResult:
    """Run every check in order and aggregate; evaluator failures give eval_error."""
    t0 = time.monotonic()
    version = spec.reward_fn_version()
    results: list[CheckResult] = []
    steps: list[float] | None = None
    try:
        for f in spec.files:
            path = f.path if f.path.startswith("/") else f"{workdir.rstrip('/')}/{f.path}"
            await sandbox.put_file(path, f.data(), mode=f.mode)
        for i, check in enumerate(spec.checks):
            r, step = await _run_check(sandbox, check, workdir, i)
            results.append(r)
            if step is not None and len(spec.checks) == 1:
                steps = step
    except (EvaluatorError, SandboxError, OSError) as e:
        return EvaluationResult(
            status="eval_error",
            reward=None,
            verdict="error",
            checks=results,
            reward_fn_version=version,
            duration_s=round(time.monotonic() - t0, 3),
            error=str(e),
        )
    weights = [c.weight for c in spec.checks]
    if spec.aggregate == "all":
        reward = 1.0 if all(r.passed for r in results) else 0.0
    elif spec.aggregate == "sum":
        reward = sum(w * r.score for w, r in zip(weights, results, strict=True))
    else:
        total = sum(weights) or 1.0
        reward = sum(w * r.score for w, r in zip(weights, results, strict=True)) / total
    if steps is None and len(results) > 1:
        steps = [r.score for r in results]
    return EvaluationResult(
        status="ok",
        reward=reward,
        step_rewards=steps,
        verdict="pass" if reward >= spec.pass_threshold else "fail",
        checks=results,
        reward_fn_version=version,
        duration_s=round(time.monotonic() - t0, 3),
    )


@register_hook
class EvaluateHook(Hook):
    """after_run: evaluate the task's contract (also after an agent time-out: partial
    work may still pass). Evaluator crashes become `eval_error`, never an exception."""

    name = "evaluate"
    Params = EvaluateParams
    params: EvaluateParams

    async def after_run(self, ctx: HookContext) -> None:
        spec = self.params.spec or ctx.evaluation_spec
        if spec is None:
            return
        ctx.evaluation = await evaluate(ctx.sandbox, spec, ctx.harness_ctx.workdir)
        path = ctx.artifacts_dir / "evaluation.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ctx.evaluation.model_dump_json(indent=2))
        ctx.add_artifact(path, "evaluation")
