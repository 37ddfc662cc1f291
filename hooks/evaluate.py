"""`evaluate`: run the task's success check in the sandbox and turn it into reward(s).

A *broken evaluator* is not a wrong answer: if a check cannot be carried out (command
not found, time-out, unparsable reward output, sandbox failure) the result is
`status="eval_error"` with `reward=None`, so a trainer never learns from a reward of 0
that the agent did not earn — unless the agent broke the sandbox the check needed
(filled its disk, ended its supervisor, removed or closed its workdir: measured after
the failure by `Sandbox.agent_damage`; or removed a directory a check runs in that was
there before the agent started, noted in `before_run`), or unless the check itself
shows the agent caused it (`AgentCausedEvalFailure`: a verifier's reward outside the
task's range; no reward from a verifier an oracle run showed working, `shown_working`;
a SWE-bench check that worked before the agent). Then the failure is the agent's
doing: `status="agent_broke_sandbox"`, reward 0, and why in `damage`. The spec and
result models are in `schemas.evaluation`.

The checks run in the agent's own sandbox, each in the clean room
(`Sandbox.evaluator_exec`: every process killed first, fresh HOME, system PATH, no user
site, neutral git), and the hidden files are placed right after a kill, so nothing the
agent left can run code in the evaluator. What the evaluation writes (the hidden files,
`/tests`, a verifier's reward dir) is probed before the agent starts (`unwritable`), so
a write the agent blocked is its doing, not a masked error. Nothing the checks use may
sit where the agent could have prepared it either: a script check's script arrives on
stdin and is written into a directory `mktemp -d` creates at run time (random name,
created exclusively, mode 0700), never to a path the agent could guess, pre-create or
symlink (`_SCRIPT_RUNNER`); a Python interpreter gets ``-s`` (no user site dir). A `swebench`
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
from pathlib import Path
from typing import Any

from hooks.base import Hook, HookContext, register_hook
from hooks.check_failures import AgentCausedEvalFailure
from hooks.collect_logs import TASK_LOG_KIND, collect_log_files
from hooks.reward_file import (
    MAX_REWARD_FILE_BYTES,
    REWARD_JSON,
    REWARD_TXT,
    RewardFileError,
    RewardOutOfRange,
    read_reward_files,
)
from hooks.swebench_check import SweBenchEvalError, run_swebench_check
from hooks.swebench_check import preflight as swebench_preflight
from sandboxes.base import (
    SYSTEM_TOOLS_ENV,
    TESTS_DIR,
    ArchiveTooLarge,
    EvalHeadroom,
    Sandbox,
    SandboxError,
    SandboxNotFound,
)
from schemas.base import StrictModel
from schemas.evaluation import (
    CheckResult,
    CommandCheck,
    EvaluationResult,
    EvaluationSpec,
    FileCheck,
    RewardFileCheck,
    ScriptCheck,
    SweBenchCheck,
    VerifierEvidence,
)
from schemas.outcome import LogSpec

_DETAIL_CHARS = 4000
#: Log kind (and artifacts subdir under ``logs/``) of what a verifier left in its reward
#: dir: beside the agent's `/logs` dirs that `collect_logs` collects.
VERIFIER_LOG_KIND = TASK_LOG_KIND
#: Runs a script check: the script comes on stdin into a fresh private directory; the
#: interpreter gets a real path (some resolve it) and /dev/null as stdin, as before.
#: No directory → exit 126, an evaluator error.
_SCRIPT_RUNNER = (
    "d=$(mktemp -d) || exit 126; trap 'rm -rf \"$d\"' EXIT; "
    'cat > "$d/script" && {interpreter} "$d/script" </dev/null'
)


#: Empties each directory given (made if missing; a symlink or file there is replaced),
#: after checking the evaluation runs as the user asked for (`$1`; empty: any). Exit 3:
#: another user; 1: a directory could not be emptied (the reason on stdout).
_PREPARE_DIRS = r"""
want=$1; shift
if [ -n "$want" ] && [ "$want" != "$(id -un)" ] && [ "$want" != "$(id -u)" ]; then
  echo "$(id -un) (uid $(id -u))"; exit 3
fi
for d; do
  if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f -- "$d" || exit 1; fi
  mkdir -p -- "$d" || exit 1
  chmod -R u+rwX -- "$d" 2>/dev/null
  find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + 2>&1
  left=$(ls -A -- "$d") || exit 1
  [ -z "$left" ] || { echo "$d could not be emptied (left: $(echo $left | head -c 200))"; exit 1; }
done
"""


#: For each pair `KIND PATH` (f: a file the evaluation writes, d: a directory it
#: empties), one line ``PATH<TAB>why`` if it could not be written now; nothing if it
#: could. Paths are absolute. Writes nothing and starts no program (it must answer on a
#: full disk, and run nothing the agent planted).
_WRITABLE_PROBE = r"""
while [ $# -ge 2 ]; do
  kind=$1 p=$2; shift 2
  if [ -d "$p" ] && [ ! -L "$p" ]; then
    if [ "$kind" = f ]; then printf '%s\t%s is a directory\n' "$p" "$p"
    elif [ ! -O "$p" ]; then printf '%s\t%s belongs to another user\n' "$p" "$p"; fi
    continue
  fi
  a=${p%/*}; a=${a:-/}
  while [ ! -e "$a" ] && [ ! -L "$a" ]; do a=${a%/*}; a=${a:-/}; done
  if [ -L "$a" ] && [ ! -e "$a" ]; then why="$a is a dangling symlink"
  elif [ ! -d "$a" ]; then why="$a is not a directory"
  elif [ ! -w "$a" ] || [ ! -x "$a" ]; then why="$a takes no new file"
  else continue; fi
  printf '%s\t%s\n' "$p" "$why"
done
"""


#: What a verifier (`RewardFileCheck`) runs with on top of the clean room, so nothing
#: in the agent's workdir steers the tools a test.sh typically calls there; the task's
#: own verifier env overrides each one (an empty PYTHONSAFEPATH, UV_NO_CONFIG=0).
#: PYTHONSAFEPATH: `python -m pytest` in the workdir puts no cwd on sys.path (a
#: `unittest.py` or `pytest.py` of the agent's shadows nothing; Python >= 3.11).
#: UV_NO_CONFIG: uv reads no uv.toml, pyproject.toml [tool.uv] or .python-version
#: (project, user or system), so its index and interpreter are not the agent's.
#: PIP_CONFIG_FILE=/dev/null: pip loads no config file (global, user, or a venv's).
VERIFIER_ENV = {"PYTHONSAFEPATH": "1", "UV_NO_CONFIG": "1", "PIP_CONFIG_FILE": "/dev/null"}


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
    """The check could not be carried out (not: the agent's answer was wrong).
    `exit_code` and `timed_out`: how the check's own command ended, when it ran."""

    def __init__(self, message: str, *, exit_code: int | None = None, timed_out: bool = False):
        super().__init__(message)
        self.exit_code = exit_code
        self.timed_out = timed_out


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


async def _prepare_dirs(
    sandbox: Sandbox, dirs: Sequence[str], *, user: str | None = None, what: str
) -> None:
    """Kill every process, then check the evaluation runs as `user` and empty `dirs`;
    EvaluatorError naming `what` if it cannot."""
    try:
        res = await sandbox.evaluator_exec(
            ["/bin/sh", "-c", _PREPARE_DIRS, "prepare", user or "", *dirs],
            cwd="/",
            timeout=120,
        )
    except SandboxError as e:
        raise EvaluatorError(f"{what}: sandbox error {e!r}") from e
    out = _tail(res.stdout + res.stderr).strip()
    if res.exit_code == 3:
        raise EvaluatorError(
            f"{what}: the verifier must run as user {user!r}, but this sandbox backend "
            f"runs every evaluation step as the agent's user, {out}, and cannot switch "
            "users; leave the verifier user unset (or set it to the agent's user)"
        )
    if res.timed_out or res.exit_code != 0:
        raise EvaluatorError(f"{what}: could not empty {list(dirs)}: {out}")


def _write_targets(spec: EvaluationSpec, workdir: str) -> list[tuple[str, str]]:
    """What the evaluation writes outside what a check does itself: ("d", dir) for a dir
    it empties (/tests, a verifier's reward dir), ("f", path) for a hidden file."""
    targets: list[tuple[str, str]] = []
    verifiers = [c for c in spec.checks if isinstance(c, RewardFileCheck)]
    if verifiers or any(_inside(f.path, TESTS_DIR) for f in spec.files):
        targets.append(("d", TESTS_DIR))
    for c in verifiers:
        cwd = posixpath.join(workdir, c.cwd) if c.cwd else workdir
        targets.append(("d", posixpath.normpath(posixpath.join(cwd, c.reward_dir))))
    for f in spec.files:
        targets.append(("f", f.path if f.path.startswith("/") else posixpath.join(workdir, f.path)))
    return targets


async def unwritable(sandbox: Sandbox, targets: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Those of `targets` (`_write_targets`) the evaluation could not write now, with why.

    Run before the agent (a path the task cannot write is the task's problem) and after
    a failed write (a path that became unwritable meanwhile is the agent's doing).
    """
    if not targets:
        return {}
    res = await sandbox.exec(
        ["/bin/sh", "-c", _WRITABLE_PROBE, "probe", *(x for t in targets for x in t)],
        env=SYSTEM_TOOLS_ENV,
        cwd="/",
        timeout=60,
    )
    if res.timed_out or res.exit_code != 0:
        raise SandboxError(f"the write probe failed (exit {res.exit_code}): {res.stderr[-500:]}")
    found = (ln.split("\t", 1) for ln in res.stdout.splitlines() if "\t" in ln)
    return {path: why for path, why in found}


async def _blocked_by_agent(
    sandbox: Sandbox, targets: Sequence[tuple[str, str]], before: Mapping[str, str]
) -> str | None:
    """What the evaluation writes that the agent made unwritable (it could be written
    before the agent ran), or None; a probe that cannot run finds nothing."""
    try:
        now = await unwritable(sandbox, targets)
    except SandboxError:
        return None
    new = [f"{why} (it could be written before the agent ran)" for p, why in now.items()
           if p not in before]  # fmt: skip
    return "; ".join(new) or None


async def _read_reward_file(sandbox: Sandbox, path: str) -> bytes | None:
    """The file at `path` (None: there is none), read with the reward file's cap."""
    try:
        return await sandbox.get_file(path, max_bytes=MAX_REWARD_FILE_BYTES + 4096)
    except ArchiveTooLarge as e:
        raise RewardFileError(f"{path} is larger than {MAX_REWARD_FILE_BYTES} bytes") from e
    except (SandboxNotFound, FileNotFoundError):
        return None


async def _run_reward_file_check(
    sandbox: Sandbox, check: RewardFileCheck, name: str, cwd: str
) -> tuple[CheckResult, dict[str, float]]:
    """Harbor's verifier: empty the reward dir, run the command, read the reward it wrote.

    The command's exit code is recorded, never scored: the reward file decides
    (`hooks.reward_file`). A reward out of range is the agent's failure; so is no
    reward at all (a time-out, no or a bad reward file) when `check.shown_working`
    says this verifier gave one in this environment without the agent.
    """
    t0 = time.monotonic()
    rdir = posixpath.normpath(posixpath.join(cwd, check.reward_dir))
    if rdir == "/" or _inside(cwd, rdir) or _inside(TESTS_DIR, rdir):
        # Emptied before the run: never a dir holding the agent's work or the tests.
        raise EvaluatorError(
            f"verifier {name}: reward_dir {check.reward_dir!r} would empty {rdir}, which "
            f"holds the workdir or {TESTS_DIR}; give the verifier a directory of its own"
        )
    await _prepare_dirs(sandbox, [rdir], user=check.user, what=f"verifier {name}")
    try:
        res = await sandbox.evaluator_exec(
            check.command, cwd=cwd, env={**VERIFIER_ENV, **check.env}, timeout=check.timeout_s,
            stop_processes=False,
        )  # fmt: skip
        # Whatever the verifier started (the agent's code under test) stops here, so the
        # reward file is read as the verifier left it.
        await sandbox.kill_all_processes()
    except SandboxError as e:
        raise EvaluatorError(f"verifier {name}: sandbox error {e!r}") from e
    output = _tail(res.stdout + ("\n" + res.stderr if res.stderr else ""))
    if res.timed_out:
        why = f"it timed out after {check.timeout_s}s (its timeout)"
        raise _no_reward(sandbox, check, name, why, res.exit_code, output)
    try:
        txt = await _read_reward_file(sandbox, posixpath.join(rdir, REWARD_TXT))
        data = await _read_reward_file(sandbox, posixpath.join(rdir, REWARD_JSON))
        reading = read_reward_files(txt, data, check.reward_key, check.reward_range)
    except RewardOutOfRange as e:
        raise AgentCausedEvalFailure(
            f"{e}: the task's verifier writes no such reward, the code it ran did (a "
            "dataset on another scale declares it: --reward-range)",
            f"verifier {name} (exit {res.exit_code}); output tail: {output}",
        ) from e
    except RewardFileError as e:
        raise _no_reward(sandbox, check, name, f"{e} in {rdir}", res.exit_code, output) from e
    notes = "".join(f"; {n}" for n in reading.notes)
    return CheckResult(
        name=name,
        kind=check.kind,
        passed=reading.reward >= check.reward_range[1],
        score=reading.reward,
        exit_code=res.exit_code,
        duration_s=round(time.monotonic() - t0, 3),
        detail=_tail(
            f"reward {reading.reward} from {reading.source} (exit {res.exit_code}){notes}\n{output}"
        ),
        source=reading.source,
    ), reading.metrics


def _no_reward(
    sandbox: Sandbox, check: RewardFileCheck, name: str, why: str, code: int, output: str
) -> EvaluatorError | AgentCausedEvalFailure:
    """The error for a verifier that gave no reward: the agent's fault when the verifier
    was shown working in this environment, else ours, saying how to show it."""
    message = f"verifier {name} (exit {code}): {why}; output tail: {output}"
    evidence = check.shown_working
    if evidence is not None and _covers(evidence, sandbox):
        return AgentCausedEvalFailure(
            f"the verifier gave no reward after the agent ({why}), but wrote one in range "
            f"within its timeout where the agent could not interfere (oracle rollout "
            f"{evidence.rollout_id}, reward {evidence.reward})",
            message,
        )
    if evidence is not None:
        shown = f"shown working on image {evidence.image_digest}, not on this sandbox's"
        return EvaluatorError(
            f"{message} (the verifier was {shown} {sandbox.handle.env_version}: run the "
            "task with --harness oracle again to show it works on this one)"
        )
    return EvaluatorError(
        f"{message} (no run without the agent has shown this verifier works here: "
        "`rollout run DATASET --harness oracle` records one; see docs/tasks.md)"
    )


def _covers(evidence: VerifierEvidence, sandbox: Sandbox) -> bool:
    """Whether `evidence` was gathered on the image this sandbox runs."""
    return evidence.image_digest is None or evidence.image_digest == sandbox.handle.env_version


async def _run_check(
    sandbox: Sandbox,
    check: CommandCheck | ScriptCheck | FileCheck | RewardFileCheck | SweBenchCheck,
    workdir: str,
    idx: int,
    preflight_problem: str | None = "",
) -> tuple[CheckResult, list[float] | None, dict[str, float]]:
    name = check.name or f"{check.kind}{idx}"
    cwd = posixpath.join(workdir, check.cwd) if check.cwd else workdir
    t0 = time.monotonic()
    if isinstance(check, RewardFileCheck):
        result, metrics = await _run_reward_file_check(sandbox, check, name, cwd)
        return result, None, metrics
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
        raise EvaluatorError(
            f"check {name} timed out after {check.timeout_s}s: {output}", timed_out=True
        )
    if res.exit_code in check.error_exit_codes:
        raise EvaluatorError(
            f"check {name} could not run (exit {res.exit_code}): {output}",
            exit_code=res.exit_code,
        )
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


def _failed_check(running: tuple[int, Any, float], error: BaseException) -> CheckResult:
    """The check an evaluation stopped in, as a result: failed, with why (the error and
    the output tail it carries) as its detail, so it is recorded with the others."""
    i, check, t0 = running
    return CheckResult(
        name=check.name or f"{check.kind}{i}",
        kind=check.kind,
        passed=False,
        score=0.0,
        exit_code=getattr(error, "exit_code", None),
        timed_out=getattr(error, "timed_out", False),
        duration_s=round(time.monotonic() - t0, 3),
        detail=_tail(str(error)),
    )


def _inside(path: str, directory: str) -> bool:
    p = posixpath.normpath(path)
    return p == directory or p.startswith(directory.rstrip("/") + "/")


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
    unwritable_before: Mapping[str, str] | None = None,
    headroom: EvalHeadroom | None = None,
) -> EvaluationResult:
    """Run every check in order and aggregate; evaluator failures give eval_error.

    `check_dirs`: check directories that existed before the agent ran; one of them
    gone after a failure is the agent's doing. `preflight`: `preflight_checks` before
    the agent ran. `unwritable_before`: `unwritable` for `_write_targets` before the
    agent ran; one that became unwritable after a failure is the agent's doing.
    `headroom`: the free space the evaluation needs (the task's resources)."""
    t0 = time.monotonic()
    version = spec.reward_fn_version()
    results: list[CheckResult] = []
    steps: list[float] | None = None
    metrics: dict[str, float] = {}
    verifiers = [c for c in spec.checks if isinstance(c, RewardFileCheck)]
    graded = [c for c in spec.checks if isinstance(c, RewardFileCheck | SweBenchCheck)]
    running: tuple[int, Any, float] | None = None  # the check under way, when one is
    try:
        if spec.files or verifiers:
            # Nothing may be running when the hidden files arrive.
            await sandbox.kill_all_processes()
        if verifiers or any(_inside(f.path, TESTS_DIR) for f in spec.files):
            # The tests dir holds only the task's files: whatever the agent put there
            # (a conftest.py, a test.sh of its own) is gone before they arrive.
            await _prepare_dirs(sandbox, [TESTS_DIR], what=f"preparing {TESTS_DIR}")
        for f in spec.files:
            path = f.path if f.path.startswith("/") else f"{workdir.rstrip('/')}/{f.path}"
            await sandbox.put_file(path, f.data(), mode=f.mode)
        for i, check in enumerate(spec.checks):
            before = (preflight or {}).get(i, "")
            running = (i, check, time.monotonic())
            r, step, found = await _run_check(sandbox, check, workdir, i, before)
            results.append(r)
            if step is not None and len(spec.checks) == 1:
                steps = step
            prefix = f"{r.name}." if len(graded) > 1 else ""
            metrics.update({f"{prefix}{k}": v for k, v in found.items()})
    except (EvaluatorError, SandboxError, OSError, AgentCausedEvalFailure) as e:
        # Whose failure: the agent's if a check shows it caused it or it left the
        # sandbox broken (reward 0), else ours.
        damage = e.reason if isinstance(e, AgentCausedEvalFailure) else None
        damage = damage or await sandbox.agent_damage(workdir, check_dirs, headroom)
        if damage is None and unwritable_before is not None:
            targets = _write_targets(spec, workdir)
            damage = await _blocked_by_agent(sandbox, targets, unwritable_before)
        if running is not None and len(results) == running[0]:
            results.append(_failed_check(running, e))
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

    @property
    def _unwritable_key(self) -> str:
        return f"evaluate.{id(self)}.unwritable"

    async def before_run(self, ctx: HookContext) -> None:
        """Notes which check directories exist and which paths the evaluation writes
        can be written before the agent can touch them: one gone or blocked after a
        failed check is then the agent's doing, a task's wrong path ours."""
        spec = self.params.spec or ctx.task.evaluation
        if spec is not None:
            ctx.state[self._key] = await _existing_dirs(ctx.sandbox, _check_dirs(spec, ctx.workdir))
            ctx.state[self._preflight_key] = await preflight_checks(ctx.sandbox, spec)
            try:
                targets = _write_targets(spec, ctx.workdir)
                ctx.state[self._unwritable_key] = await unwritable(ctx.sandbox, targets)
            except SandboxError:
                pass  # not known: a failed write later stays ours

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
            unwritable_before=ctx.state.get(self._unwritable_key),
            headroom=EvalHeadroom.of_task(ctx.task.sandbox.spec_fields().get("resources")),
        )
        ctx.outcome.evaluation = evaluation
        path = ctx.artifacts_dir / "evaluation.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(evaluation.model_dump_json(indent=2))
        ctx.add_artifact(path, "evaluation")
        await self._collect_verifier_logs(ctx, spec)

    async def _collect_verifier_logs(self, ctx: HookContext, spec: EvaluationSpec) -> None:
        """What each verifier left in its reward dir (its reward file, its test logs):
        artifacts, also after an evaluator error, where they say what went wrong."""
        dirs = sorted({c.reward_dir for c in spec.checks if isinstance(c, RewardFileCheck)})
        if not dirs:
            return
        errors: list[str] = []
        specs = [LogSpec(path=d, kind=VERIFIER_LOG_KIND) for d in dirs]
        files = await collect_log_files(
            ctx.sandbox, ctx.artifacts_dir / "logs", specs, errors=errors
        )
        ctx.outcome.hook_errors += [f"{self.name}: {e}" for e in errors]
        for lf in files:
            if lf.local_path:
                ctx.add_artifact(Path(lf.local_path), lf.kind)
