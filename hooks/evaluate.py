"""`evaluate`: run the task's success check in the sandbox and turn it into reward(s).

A *broken evaluator* is not a wrong answer: if a check cannot be carried out (command
not found, time-out, unparsable reward output, sandbox failure) the result is
`status="eval_error"` with `reward=None`, so a trainer never learns from a reward of 0
that the agent did not earn — unless the agent broke the sandbox the check needed
(filled its disk, ended its supervisor, removed or closed its workdir: measured after
the failure by `Sandbox.agent_damage`; or removed a directory a check runs in that was
there before the agent started, noted in `before_run`). Then the failure is the agent's doing:
`status="agent_broke_sandbox"`, reward 0, and what was broken in `damage`. The spec and
result models are in `schemas.evaluation`.

The checks run in the agent's own sandbox, each in the clean room
(`Sandbox.evaluator_exec`: every process killed first, fresh HOME, system PATH, no user
site, neutral git), and the hidden files are placed right after a kill, so nothing the
agent left can run code in the evaluator. Nothing they use may sit where the agent
could have prepared it either: a script check's script arrives on stdin and is written
into a directory `mktemp -d` creates at run time (random name, created exclusively,
mode 0700), never to a path the agent could guess, pre-create or symlink
(`_SCRIPT_RUNNER`); a Python interpreter gets ``-s`` (no user site dir). A `swebench`
check (`hooks.swebench_check`) places its hidden tests with a git of its own and is
checked before the agent starts, so a later failure to place them is the agent's.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hooks.base import Hook, HookContext, register_hook
from hooks.swebench_check import SweBenchEvalError, run_swebench_check
from hooks.swebench_check import preflight as swebench_preflight
from sandboxes.base import ArchiveTooLarge, Sandbox, SandboxError
from schemas.base import StrictModel
from schemas.evaluation import (
    CheckResult,
    CommandCheck,
    EvaluationResult,
    EvaluationSpec,
    FileCheck,
    ScriptCheck,
    SweBenchCheck,
)

_DETAIL_CHARS = 4000
#: Runs a script check: the script comes on stdin into a fresh private directory; the
#: interpreter gets a real path (some resolve it) and /dev/null as stdin, as before.
#: No directory → exit 126, an evaluator error.
_SCRIPT_RUNNER = (
    "d=$(mktemp -d) || exit 126; trap 'rm -rf \"$d\"' EXIT; "
    'cat > "$d/script" && {interpreter} "$d/script" </dev/null'
)


def _isolated(interpreter: str) -> str:
    """`interpreter` with ``-s`` after a Python (also behind ``env``): its user site dir is
    never read, whatever HOME a check sets. Not ``-I``: it would drop the PYTHON*
    variables a check's own env sets (the task author's)."""
    words = shlex.split(interpreter)
    for i, word in enumerate(words):
        name = posixpath.basename(word)
        if re.fullmatch(r"python[0-9.]*", name):
            return shlex.join([*words[: i + 1], "-s", *words[i + 1 :]])
        if name != "env" and not (i and "=" in word):
            break
    return interpreter


class EvaluatorError(RuntimeError):
    """The check could not be carried out (not: the agent's answer was wrong)."""


class EvaluateParams(StrictModel):
    #: Overrides the task's `evaluation` (normally the spec comes from the task).
    spec: EvaluationSpec | None = None


def _tail(text: str) -> str:
    return text[-_DETAIL_CHARS:]


async def _file_problems(sandbox: Sandbox, check: FileCheck, path: str) -> list[str]:
    """What is wrong with the file at `path` for `check` (empty: it passes)."""
    try:
        data: str | None = (await sandbox.get_file(path)).decode("utf-8", errors="replace")
    except ArchiveTooLarge as e:
        return [f"{check.path} is larger than {e.max_bytes} bytes"]
    except (SandboxError, FileNotFoundError):
        data = None
    if data is None:
        return [f"{check.path} does not exist"] if check.exists else []
    if not check.exists:
        return [f"{check.path} exists"]
    problems: list[str] = []
    text = data.rstrip() if check.strip else data
    if check.equals is not None:
        want = check.equals.rstrip() if check.strip else check.equals
        if text != want:
            problems.append(f"content differs (got {text[:200]!r})")
    problems += [f"missing {s!r}" for s in check.contains if s not in data]
    if check.regex is not None and re.search(check.regex, data, re.MULTILINE) is None:
        problems.append(f"no match for /{check.regex}/")
    return problems


async def _run_check(
    sandbox: Sandbox,
    check: CommandCheck | ScriptCheck | FileCheck | SweBenchCheck,
    workdir: str,
    idx: int,
    preflight_problem: str | None = "",
) -> tuple[CheckResult, list[float] | None, dict[str, float]]:
    name = check.name or f"{check.kind}{idx}"
    cwd = posixpath.join(workdir, check.cwd) if check.cwd else workdir
    t0 = time.monotonic()
    if isinstance(check, SweBenchCheck):
        try:
            result, metrics = await run_swebench_check(sandbox, check, name, preflight_problem)
        except SweBenchEvalError as e:
            raise EvaluatorError(str(e)) from e
        return result, None, metrics
    if isinstance(check, FileCheck):
        path = check.path if check.path.startswith("/") else f"{cwd.rstrip('/')}/{check.path}"
        problems = await _file_problems(sandbox, check, path)
        ok = not problems
        return (
            CheckResult(
                name=name,
                kind=check.kind,
                passed=ok,
                score=1.0 if ok else 0.0,
                duration_s=round(time.monotonic() - t0, 3),
                detail="; ".join(problems) or "ok",
            ),
            None,
            {},
        )

    stdin: bytes | None = None
    if isinstance(check, ScriptCheck):
        cmd = _SCRIPT_RUNNER.format(interpreter=_isolated(check.interpreter))
        stdin = check.script.encode()
    else:
        cmd = check.command
    try:
        res = await sandbox.evaluator_exec(
            cmd, cwd=cwd, env=check.env or None, timeout=check.timeout_s, stdin=stdin
        )
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
        if res.truncated:
            # The reward is the last line; past the cap it is lost, and what is left may
            # end in a line the checked code printed (a forged `{"reward": 1.0}`).
            raise EvaluatorError(
                f"reward script {name}: its output was cut at the sandbox's output cap, "
                f"so no line of it can be trusted as the reward: {output}"
            )
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
    return (
        CheckResult(
            name=name,
            kind=check.kind,
            passed=passed,
            score=score,
            exit_code=res.exit_code,
            duration_s=round(time.monotonic() - t0, 3),
            detail=output,
        ),
        step,
        {},
    )


def _check_dirs(spec: EvaluationSpec, workdir: str) -> list[str]:
    """The directories checks run in other than the workdir (which is always probed)."""
    dirs = {posixpath.join(workdir, c.cwd) for c in spec.checks if c.cwd}
    dirs |= {c.repo_path for c in spec.checks if isinstance(c, SweBenchCheck)}
    return sorted(d for d in dirs if d.rstrip("/") != workdir.rstrip("/"))


async def _existing_dirs(sandbox: Sandbox, dirs: Sequence[str]) -> list[str]:
    """Those of `dirs` that are directories in the sandbox now."""
    if not dirs:
        return []
    res = await sandbox.exec(
        ["/bin/sh", "-c", 'for d; do [ -d "$d" ] && echo "$d"; done; true', "sh", *dirs],
        cwd="/",
        timeout=60,
    )
    return [d for d in res.stdout.splitlines() if d in dirs]


async def preflight_checks(sandbox: Sandbox, spec: EvaluationSpec) -> dict[int, str | None]:
    """Before the agent: per `swebench` check (by index), what keeps its tests from being
    placed (None: nothing), so a failure after the agent can be told apart."""
    found: dict[int, str | None] = {}
    for i, check in enumerate(spec.checks):
        if isinstance(check, SweBenchCheck):
            try:
                found[i] = await swebench_preflight(sandbox, check)
            except SandboxError as e:
                found[i] = f"sandbox error {e!r}"
    return found


async def evaluate(
    sandbox: Sandbox,
    spec: EvaluationSpec,
    workdir: str,
    check_dirs: Sequence[str] = (),
    preflight: Mapping[int, str | None] | None = None,
) -> EvaluationResult:
    """Run every check in order and aggregate; evaluator failures give eval_error.

    `check_dirs`: check directories that existed before the agent ran; one of them
    gone after a failure is the agent's doing. `preflight`: `preflight_checks` before
    the agent ran."""
    t0 = time.monotonic()
    version = spec.reward_fn_version()
    results: list[CheckResult] = []
    steps: list[float] | None = None
    metrics: dict[str, float] = {}
    graded = [c for c in spec.checks if isinstance(c, SweBenchCheck)]
    try:
        if spec.files:
            # Nothing may be running when the hidden files arrive.
            await sandbox.kill_all_processes()
        for f in spec.files:
            path = f.path if f.path.startswith("/") else f"{workdir.rstrip('/')}/{f.path}"
            await sandbox.put_file(path, f.data(), mode=f.mode)
        for i, check in enumerate(spec.checks):
            before = (preflight or {}).get(i, "")
            r, step, found = await _run_check(sandbox, check, workdir, i, before)
            results.append(r)
            if step is not None and len(spec.checks) == 1:
                steps = step
            prefix = f"{r.name}." if len(graded) > 1 else ""
            metrics.update({f"{prefix}{k}": v for k, v in found.items()})
    except (EvaluatorError, SandboxError, OSError) as e:
        # Whose failure: the agent's if it left the sandbox broken (reward 0), else ours.
        damage = await sandbox.agent_damage(workdir, check_dirs)
        return EvaluationResult(
            status="agent_broke_sandbox" if damage else "eval_error",
            reward=0.0 if damage else None,
            verdict="fail" if damage else "error",
            checks=results,
            reward_fn_version=version,
            duration_s=round(time.monotonic() - t0, 3),
            error=str(e),
            damage=damage,
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
        metrics=metrics,
    )


@register_hook
class EvaluateHook(Hook):
    """after_run: evaluate the task's contract (also after an agent time-out: partial
    work may still pass). Evaluator crashes become `eval_error`, never an exception."""

    name = "evaluate"
    Params = EvaluateParams
    params: EvaluateParams

    @property
    def _key(self) -> str:
        return f"evaluate.{id(self)}.check_dirs"

    @property
    def _preflight_key(self) -> str:
        return f"evaluate.{id(self)}.preflight"

    async def before_run(self, ctx: HookContext) -> None:
        """Notes which check directories exist before the agent can touch them: one
        gone after a failed check is then the agent's doing, a task's wrong path ours."""
        spec = self.params.spec or ctx.task.evaluation
        if spec is not None:
            ctx.state[self._key] = await _existing_dirs(ctx.sandbox, _check_dirs(spec, ctx.workdir))
            ctx.state[self._preflight_key] = await preflight_checks(ctx.sandbox, spec)

    async def after_run(self, ctx: HookContext) -> None:
        spec = self.params.spec or ctx.task.evaluation
        if spec is None:
            return
        evaluation = await evaluate(
            ctx.sandbox,
            spec,
            ctx.workdir,
            check_dirs=ctx.state.get(self._key, []),
            preflight=ctx.state.get(self._preflight_key),
        )
        ctx.outcome.evaluation = evaluation
        path = ctx.artifacts_dir / "evaluation.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(evaluation.model_dump_json(indent=2))
        ctx.add_artifact(path, "evaluation")
