"""The `swebench` check: place the hidden tests, run them, grade SWE-bench's way.

Placing the tests never applies anything to the agent's files: in a scratch git dir
made at run time (fresh config, no hooks; the repo's objects read as data through
``GIT_ALTERNATE_OBJECT_DIRECTORIES``, as `capture_diff` does) the base commit's tree is
read into a scratch index, the test patch is applied to that index, and every file the
patch touches is written from it into the work tree (`git checkout-index -f`; a file
the patch deletes is removed). So each such file is exactly base + test patch, whatever
the agent did to it, and nothing in the repo's `.git/config` or hooks runs.

Whose failure: before the agent starts (`preflight`) the same steps run without
writing anything. If the base commit is missing or the patch does not apply then, the
task is broken (an evaluator error). If they worked then and fail after the agent, the
agent changed the repository's git data: the check fails (score 0), not an error.

Grading follows SWE-bench's resolved rule: a FAIL_TO_PASS test passes with PASSED or
XFAIL (and XPASS, a non-strict pass in pytest's terms), a PASS_TO_PASS test also with
SKIPPED; a test not in the log (MISSING) fails. A log in which the parser finds no test
at all is an evaluator error carrying the log's tail: a wrong test command or parser for
the dataset looks exactly like that.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable, Mapping

from hooks.test_logs import TestStatus, get_parser
from sandboxes.base import (
    EVALUATOR_PATH,
    SYSTEM_TOOLS_ENV,
    ArchiveTooLarge,
    Sandbox,
    SandboxError,
)
from schemas.evaluation import CheckResult, SweBenchCheck

#: How much of the end of a test log is read (the pytest summary is at the end).
LOG_TAIL_BYTES = 16 * 1024 * 1024
_DETAIL_CHARS = 4000
_SCRATCH = "mktemp -d /tmp/rollout-swebench.XXXXXXXXXX"

#: Exit 3: base commit missing / not a repo; 4: the test patch does not apply. argv:
#: repo, base commit, mode (check|write); the patch on stdin.
_PLACE_TESTS = rf"""
repo=$1 base=$2 mode=$3
d=$({_SCRATCH}) || exit 126
trap 'rm -rf "$d"' EXIT
cat > "$d/test.patch" || exit 126
objects=$(git -C "$repo" rev-parse --path-format=absolute --git-path objects 2>&1) || {{
  echo "no git repository at $repo: $objects"; exit 3; }}
export GIT_ALTERNATE_OBJECT_DIRECTORIES="$objects" GIT_DIR="$d/git" GIT_INDEX_FILE="$d/index"
export GIT_WORK_TREE="$repo"
git init -q --template= || exit 126
git cat-file -e "$base^{{commit}}" 2>/dev/null || {{
  echo "base commit $base is not in the repository at $repo"; exit 3; }}
git read-tree "$base" || exit 3
git apply --cached --whitespace=nowarn "$d/test.patch" 2>&1 || {{
  echo "the test patch does not apply to $base"; exit 4; }}
[ "$mode" = write ] || exit 0
changed="git diff --cached --no-renames --no-ext-diff --no-textconv --name-only -z $base"
$changed --diff-filter=D | xargs -0 -r rm -rf -- || exit 5
$changed --diff-filter=AM | git checkout-index -f -z --stdin || exit 5
"""

#: Runs the test command (argv: the command; with the PATH the check's env gives) with
#: its output to a fresh file; prints the exit code, the scratch dir and the log's size,
#: and leaves the log's tail in "$d/tail". Its own tools come from the system dirs.
_RUN_TESTS = rf"""
test_path=$PATH PATH={EVALUATOR_PATH}
d=$({_SCRATCH}) || exit 126
PATH=$test_path /bin/sh -c "$1" > "$d/log" 2>&1 </dev/null
rc=$?
size=$(wc -c < "$d/log") || exit 126
tail -c {LOG_TAIL_BYTES} "$d/log" > "$d/tail" || exit 126
echo "$rc $d $size"
"""


class SweBenchEvalError(RuntimeError):
    """The check could not be carried out (not: the tests failed)."""


def _tail(text: str) -> str:
    return text[-_DETAIL_CHARS:]


async def _place_tests(
    sandbox: Sandbox, check: SweBenchCheck, mode: str, *, stop_processes: bool
) -> tuple[int, str]:
    res = await sandbox.evaluator_exec(
        ["/bin/sh", "-c", _PLACE_TESTS, "swebench", check.repo_path, check.base_commit, mode],
        cwd=check.repo_path,
        timeout=min(check.timeout_s, 600),
        stdin=check.test_patch.encode(),
        stop_processes=stop_processes,
    )
    out = _tail((res.stdout + "\n" + res.stderr).strip())
    if res.timed_out:
        return 124, f"placing the test files timed out: {out}"
    return res.exit_code, out


async def preflight(sandbox: Sandbox, check: SweBenchCheck) -> str | None:
    """Before the agent: what keeps the test patch from applying to the base commit
    in the sandbox's repo (None: nothing). Writes nothing into the repo."""
    code, out = await _place_tests(sandbox, check, "check", stop_processes=False)
    return None if code == 0 else f"exit {code}: {out}"


def _passes(status: str | None, *, skipped_ok: bool) -> bool:
    return status in ("PASSED", "XFAIL", "XPASS") or (skipped_ok and status == "SKIPPED")


_RANK = {"PASSED": 0, "XPASS": 0, "XFAIL": 0, "SKIPPED": 1, "FAILED": 2, "ERROR": 3}


def lookup(name: str, found: Mapping[str, TestStatus]) -> str:
    """The status of the test `name` in `found`, or MISSING.

    SWE-bench's own pytest parser cut node ids at the first space, so a dataset may
    list ``t.py::test_c[a`` for ``t.py::test_c[a b]``: a name without a space that
    matches no test exactly stands for every test whose id starts with it up to a
    space (the worst of their statuses).
    """
    if name in found:
        return found[name]
    if any(c.isspace() for c in name):
        return "MISSING"
    matches = [s for test, s in found.items() if test.split(None, 1)[0] == name]
    return max(matches, key=lambda s: _RANK.get(s, 4)) if matches else "MISSING"


def grade(
    found: Mapping[str, TestStatus], fail_to_pass: Iterable[str], pass_to_pass: Iterable[str]
) -> tuple[list[str], dict[str, str], dict[str, float]]:
    """(the listed tests that did not pass, each listed test's status, counts) by
    SWE-bench's rule; resolved means the first is empty."""
    tests: dict[str, str] = {}
    failing: list[str] = []
    counts = {"fail_to_pass_passed": 0.0, "fail_to_pass_total": 0.0}
    counts |= {"pass_to_pass_passed": 0.0, "pass_to_pass_total": 0.0}
    for group, names, skipped_ok in (
        ("fail_to_pass", fail_to_pass, False),
        ("pass_to_pass", pass_to_pass, True),
    ):
        for name in names:
            status = tests[name] = lookup(name, found)
            ok = _passes(status, skipped_ok=skipped_ok)
            counts[f"{group}_total"] += 1
            counts[f"{group}_passed"] += ok
            if not ok:
                failing.append(name)
    return failing, tests, counts


async def _read_log(sandbox: Sandbox, scratch: str) -> str:
    try:
        data = await sandbox.get_file(f"{scratch}/tail", max_bytes=LOG_TAIL_BYTES + 64 * 1024)
    except (ArchiveTooLarge, FileNotFoundError, SandboxError) as e:
        raise SweBenchEvalError(f"the test log could not be read: {e!r}") from e
    return data.decode("utf-8", errors="replace")


async def _run_tests(sandbox: Sandbox, check: SweBenchCheck, name: str) -> tuple[int, str]:
    """(the test command's exit code, its log's tail)."""
    res = await sandbox.evaluator_exec(
        ["/bin/sh", "-c", _RUN_TESTS, "swebench-tests", check.test_command],
        cwd=check.repo_path,
        env=check.env or None,
        timeout=check.timeout_s,
        stop_processes=False,
    )
    # Whatever the tests started (the agent's code) stops before the log is read.
    await sandbox.kill_all_processes()
    words = res.stdout.split()
    scratch = next((w for w in words if w.startswith("/tmp/rollout-swebench.")), None)
    log = await _read_log(sandbox, scratch) if scratch else ""
    if scratch:
        await sandbox.exec(["rm", "-rf", "--", scratch], env=SYSTEM_TOOLS_ENV, cwd="/", timeout=120)
    if res.timed_out:
        raise SweBenchEvalError(
            f"check {name}: the tests timed out after {check.timeout_s}s; log tail: " + _tail(log)
        )
    if res.exit_code != 0 or len(words) < 3 or not (words[0] + words[2]).isdigit():
        raise SweBenchEvalError(
            f"check {name}: the test runner could not start (exit {res.exit_code}): "
            + _tail(res.stdout + res.stderr)
        )
    if int(words[2]) > LOG_TAIL_BYTES:
        # Only the tail was read: a test whose status was printed before it is lost,
        # and the tail may end in lines the code under test printed.
        raise SweBenchEvalError(
            f"check {name}: the test log is {words[2]} bytes, over the {LOG_TAIL_BYTES}-byte "
            "cap; a cut log cannot be graded; log tail: " + _tail(log)
        )
    return int(words[0]), log


async def run_swebench_check(
    sandbox: Sandbox, check: SweBenchCheck, name: str, preflight_problem: str | None = ""
) -> tuple[CheckResult, dict[str, float]]:
    """Place the tests, run them, grade; SweBenchEvalError when it cannot be done.

    `preflight_problem`: what `preflight` found before the agent (None: nothing, a
    placing failure now is the agent's doing); "" when no preflight ran (a failure is
    then ours, as nothing shows the agent caused it).
    """
    t0 = time.monotonic()
    try:
        parser = get_parser(check.log_parser)
    except KeyError as e:
        raise SweBenchEvalError(f"check {name}: {e.args[0]}") from None
    if preflight_problem:
        raise SweBenchEvalError(
            f"check {name}: before the agent ran, the test patch could not be placed "
            f"({preflight_problem})"
        )
    try:
        code, out = await _place_tests(sandbox, check, "write", stop_processes=True)
        if code != 0:
            if preflight_problem is None:
                detail = (
                    "the test files could not be placed although they could before the "
                    f"agent ran: it changed the repository's git data (exit {code}): {out}"
                )
                return CheckResult(
                    name=name,
                    kind=check.kind,
                    passed=False,
                    score=0.0,
                    exit_code=code,
                    duration_s=round(time.monotonic() - t0, 3),
                    detail=_tail(detail),
                ), {}
            raise SweBenchEvalError(
                f"check {name}: placing the test files failed (exit {code}): {out}"
            )
        exit_code, log = await _run_tests(sandbox, check, name)
    except SandboxError as e:
        raise SweBenchEvalError(f"check {name}: sandbox error {e!r}") from e
    found = parser.parse(log)
    if not found:
        raise SweBenchEvalError(
            f"check {name}: the {parser.name} parser found no test in the output of "
            f"{shlex.quote(check.test_command)} (exit {exit_code}); log tail: {_tail(log)}"
        )
    failing, tests, counts = grade(found, check.fail_to_pass, check.pass_to_pass)
    resolved = not failing
    summary = (
        f"resolved: {int(counts['fail_to_pass_passed'])}/{int(counts['fail_to_pass_total'])} "
        f"FAIL_TO_PASS, {int(counts['pass_to_pass_passed'])}/{int(counts['pass_to_pass_total'])} "
        f"PASS_TO_PASS passed (exit {exit_code})"
    )
    if not resolved:
        summary = "not " + summary
        summary += "; not passing: " + ", ".join(f"{t} {tests[t]}" for t in failing[:20])
    return CheckResult(
        name=name,
        kind=check.kind,
        passed=resolved,
        score=1.0 if resolved else 0.0,
        exit_code=exit_code,
        duration_s=round(time.monotonic() - t0, 3),
        detail=_tail(f"{summary}\n{log}"),
        tests=tests,
    ), counts
