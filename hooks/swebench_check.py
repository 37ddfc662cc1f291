"""The `swebench` check: place the hidden tests, run them, grade SWE-bench's way.

Placing the tests never applies anything to the agent's files: in a scratch git dir
made at run time (fresh config, no hooks; the repo's objects read as data through
``GIT_ALTERNATE_OBJECT_DIRECTORIES``, as `capture_diff` does) the base commit's tree is
read into a scratch index, the test patch is applied to that index, and every file the
patch touches is written from it into the work tree (`git checkout-index -f`; a file
the patch deletes is removed). So each such file is exactly base + test patch, whatever
the agent did to it, and nothing in the repo's `.git/config` or hooks runs.

The test runner is configured by the dataset, never by the code under test: in the same
step every file named in `RUNNER_CONFIG_FILES` anywhere in the work tree (untracked and
ignored dirs too; `.git` dirs aside) is removed, and those the base commit has (with the
test patch applied, so the patch's own conftest.py stays) are written back whole. The
tests then run with plugin autoloading off (`SweBenchCheck.pytest_plugins` names the
plugins loaded), no cache provider, conftest files only from inside the repo, and, for
pytest, ``PYTHONSAFEPATH`` (no cwd first on the path: a ``pytest.py`` in the repo does not
shadow the runner). With the `pytest` parser the verdict comes from pytest's JUnit XML
report, written into a directory made at run time (random name, mode 0700); another
runner's verdict comes from its log. `CheckResult.source` says which.

Whose failure: before the agent starts (`preflight`) the same placing runs without
writing anything. If the base commit is missing or the patch does not apply then, the
task is broken (an evaluator error). If they worked then and fail after the agent, the
agent changed the repository: the check fails (score 0), not an error. Likewise a run
that gives no verdict after a passed preflight (the runner ended before writing its
report, timed out, or left a log too long to grade) is the agent's doing: its code ran
in that runner. It raises `AgentCausedEvalFailure` (status ``agent_broke_sandbox``,
reward 0). A test command or parser that does not fit the dataset gives no verdict
either; that is found before training by running the instances' gold patches (every
instance must resolve), not told apart here.

Grading follows SWE-bench's resolved rule: a FAIL_TO_PASS test passes with PASSED or
XFAIL (and XPASS, a non-strict pass in pytest's terms), a PASS_TO_PASS test also with
SKIPPED; a test not in the report (MISSING) fails.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from hooks.check_failures import AgentCausedEvalFailure
from hooks.test_logs import STATUS_RANK, TestLogParser, TestStatus, get_parser
from hooks.test_logs.junit import MAX_JUNIT_BYTES, JunitReportError, junit_address, parse_junit
from sandboxes.base import (
    EVALUATOR_PATH,
    SYSTEM_TOOLS_ENV,
    ArchiveTooLarge,
    Sandbox,
    SandboxError,
    SandboxNotFound,
)
from schemas.evaluation import CheckResult, SweBenchCheck

#: How much of the end of a test log is read (the pytest summary is at the end).
LOG_TAIL_BYTES = 16 * 1024 * 1024
_DETAIL_CHARS = 4000
_SCRATCH = "mktemp -d /tmp/rollout-swebench.XXXXXXXXXX"
#: Files that configure the test run (pytest's ini files, conftest plugins, tox and
#: setuptools config, and modules Python imports at start-up): set to the base commit's.
RUNNER_CONFIG_FILES = (
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "usercustomize.py",
)
_FIND_NAMES = " -o ".join(f"-name {n}" for n in RUNNER_CONFIG_FILES)
_PATHSPECS = " ".join(f"':(glob)**/{n}'" for n in RUNNER_CONFIG_FILES)
#: Where the JUnit report goes in the run's scratch dir.
_REPORT = "report.xml"

#: Exit 3: base commit missing / not a repo; 4: the test patch does not apply; 5: the
#: files could not be written; 6: the work tree could not be searched for runner config.
#: argv: repo, base commit, mode (check|write); the patch on stdin.
_PLACE_HEAD = rf"""
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
"""
#: The runner's config: every such file in the work tree goes, then the index's (base +
#: test patch) are written back.
_RESTORE_RUNNER_CONFIG = rf"""
find "$repo" -name .git -prune -o \( {_FIND_NAMES} \) -print0 > "$d/config" 2>"$d/err" || {{
  echo "the repository could not be searched for test-runner config:"; head -c 2000 "$d/err"
  exit 6; }}
xargs -0 -r rm -rf -- < "$d/config" || exit 5
git ls-files -z -- {_PATHSPECS} | git checkout-index -f -z --stdin || exit 5
"""
_WRITE_PATCHED = """
$changed --diff-filter=AM | git checkout-index -f -z --stdin || exit 5
"""
PLACE_TESTS = _PLACE_HEAD + _RESTORE_RUNNER_CONFIG + _WRITE_PATCHED
#: The same without the runner-config restore (the bench's baseline).
PLACE_TESTS_ONLY = _PLACE_HEAD + _WRITE_PATCHED

#: Runs the test command (argv: the command, its timeout in seconds, pytest options;
#: with the PATH the check's env gives) with its output to a fresh file, pytest's JUnit
#: report beside it. Prints the scratch dir first, then the exit code, the seconds taken,
#: the log's size and the report's (- for none), and leaves the log's tail in
#: "$d/tail". Its own tools come from the system dirs.
_RUN_TESTS = rf"""
test_path=$PATH PATH={EVALUATOR_PATH}
d=$({_SCRATCH}) || exit 126
echo "$d"
start=$(date +%s) || exit 126
PYTEST_ADDOPTS="${{PYTEST_ADDOPTS:+$PYTEST_ADDOPTS }}--junitxml=$d/{_REPORT} $3" PATH=$test_path \
  timeout -k 10 "$2" /bin/sh -c "$1" > "$d/log" 2>&1 </dev/null
rc=$? took=$(( $(date +%s) - start ))
size=$(wc -c < "$d/log") || exit 126
tail -c {LOG_TAIL_BYTES} "$d/log" > "$d/tail" || exit 126
report=-
if [ -f "$d/{_REPORT}" ] && [ ! -L "$d/{_REPORT}" ]; then report=$(wc -c < "$d/{_REPORT}"); fi
echo "$rc $took $size $report"
"""


class SweBenchEvalError(RuntimeError):
    """The check could not be carried out (not: the tests failed)."""


def _tail(text: str) -> str:
    return text[-_DETAIL_CHARS:]


async def _place_tests(
    sandbox: Sandbox, check: SweBenchCheck, mode: str, *, stop_processes: bool
) -> tuple[int, str]:
    res = await sandbox.evaluator_exec(
        ["/bin/sh", "-c", PLACE_TESTS, "swebench", check.repo_path, check.base_commit, mode],
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
    return max(matches, key=lambda s: STATUS_RANK.get(s, 4)) if matches else "MISSING"


def grade(
    found: Mapping[str, TestStatus],
    fail_to_pass: Iterable[str],
    pass_to_pass: Iterable[str],
    key: Callable[[str], str] = str,
) -> tuple[list[str], dict[str, str], dict[str, float]]:
    """(the listed tests that did not pass, each listed test's status, counts) by
    SWE-bench's rule; resolved means the first is empty. `key`: a listed name → how
    `found` names that test (`junit_address` for a JUnit report)."""
    tests: dict[str, str] = {}
    failing: list[str] = []
    counts = {"fail_to_pass_passed": 0.0, "fail_to_pass_total": 0.0}
    counts |= {"pass_to_pass_passed": 0.0, "pass_to_pass_total": 0.0}
    for group, names, skipped_ok in (
        ("fail_to_pass", fail_to_pass, False),
        ("pass_to_pass", pass_to_pass, True),
    ):
        for name in names:
            status = tests[name] = lookup(key(name), found)
            ok = _passes(status, skipped_ok=skipped_ok)
            counts[f"{group}_total"] += 1
            counts[f"{group}_passed"] += ok
            if not ok:
                failing.append(name)
    return failing, tests, counts


def run_env(check: SweBenchCheck, pytest: bool) -> tuple[dict[str, str], str]:
    """(the test command's env, the pytest options `_RUN_TESTS` adds to PYTEST_ADDOPTS).

    The check's env is the dataset's; what keeps the code under test from configuring
    the runner goes on top of it."""
    env = {**check.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if pytest:
        env["PYTHONSAFEPATH"] = "1"
    opts = ["-p", "no:cacheprovider", f"--confcutdir={check.repo_path}"]
    for plugin in check.pytest_plugins:
        opts += ["-p", plugin]
    return env, shlex.join(opts)


@dataclass
class _Run:
    """One run of the test command: what it printed and left."""

    exit_code: int
    log: str = ""
    log_size: int = 0
    #: The JUnit report's size (None: there is none) and content (None: not read).
    report_size: int | None = None
    report: bytes | None = None
    #: Why the run gives no verdict, whatever it left (None: it may give one).
    problem: str | None = None


async def _read(sandbox: Sandbox, path: str, cap: int) -> bytes | str:
    """The file, or why it cannot be read: the run's scratch dir is the evaluation's,
    so one missing or replaced there was changed by what the tests started."""
    try:
        return await sandbox.get_file(path, max_bytes=cap + 64 * 1024)
    except (ArchiveTooLarge, FileNotFoundError, SandboxNotFound) as e:
        return f"{path} was changed while the tests ran: {e}"


async def _run_tests(sandbox: Sandbox, check: SweBenchCheck, name: str, pytest: bool) -> _Run:
    """Run the test command; its log's tail and, with `pytest`, its JUnit report."""
    env, opts = run_env(check, pytest)
    limit = math.ceil(check.timeout_s)
    res = await sandbox.evaluator_exec(
        ["/bin/sh", "-c", _RUN_TESTS, "swebench-tests", check.test_command, str(limit), opts],
        cwd=check.repo_path,
        env=env,
        timeout=limit + 120,
        stop_processes=False,
    )
    # Whatever the tests started (the agent's code) stops before anything is read.
    await sandbox.kill_all_processes()
    lines = res.stdout.strip().split("\n")
    scratch = lines[0] if lines[0].startswith("/tmp/rollout-swebench.") else None
    timed_out = _Run(124, problem=f"the tests timed out after {check.timeout_s}s")
    try:
        if res.timed_out:
            return timed_out
        if res.exit_code != 0 or scratch is None:
            raise SweBenchEvalError(
                f"check {name}: the test runner could not start (exit {res.exit_code}): "
                + _tail(res.stdout + res.stderr)
            )
        words = lines[-1].split()
        if len(lines) < 2 or len(words) != 4 or not "".join(words[:3]).isdigit():
            # The script's last line, which its last command prints: something the tests
            # started wrote into the evaluation's own output.
            return _Run(-1, problem=f"the test run's status line was overwritten: {lines[-1]!r}")
        rc, took, size = (int(w) for w in words[:3])
        log = await _read(sandbox, f"{scratch}/tail", LOG_TAIL_BYTES)
        if isinstance(log, str):
            return _Run(rc, problem=log)
        run = _Run(rc, log.decode(errors="replace"), size)
        if rc in (124, 137) and took >= limit:
            run.problem = timed_out.problem
        elif pytest and words[3] != "-":
            run.report_size = int(words[3]) if words[3].isdigit() else MAX_JUNIT_BYTES + 1
            if run.report_size <= MAX_JUNIT_BYTES:
                report = await _read(sandbox, f"{scratch}/{_REPORT}", MAX_JUNIT_BYTES)
                run.report, run.problem = (
                    (None, report) if isinstance(report, str) else (report, None)
                )
        return run
    finally:
        if scratch:
            await sandbox.exec(
                ["rm", "-rf", "--", scratch], env=SYSTEM_TOOLS_ENV, cwd="/", timeout=120
            )


def _verdict(
    run: _Run, pytest: bool, parser: TestLogParser
) -> tuple[dict[str, TestStatus], str, str | None]:
    """(each test's status, the verdict's source, why there is no verdict or None)."""
    source = "junit-xml" if pytest else f"log:{parser.name}"
    if run.problem is not None:
        return {}, source, run.problem
    if pytest:
        if run.report_size is None:
            why = f"pytest wrote no JUnit report: the test run ended first (exit {run.exit_code})"
            return {}, source, why
        if run.report is None:
            return {}, source, f"pytest's JUnit report is {run.report_size} bytes, over the cap"
        try:
            found = parse_junit(run.report)
        except JunitReportError as e:
            return {}, source, f"pytest's JUnit report could not be read: {e}"
        return found, source, None if found else "pytest's JUnit report has no test"
    if run.log_size > LOG_TAIL_BYTES:
        # Only the tail was read: a test whose status was printed before it is lost,
        # and the tail may end in lines the code under test printed.
        why = f"the test log is {run.log_size} bytes, over the {LOG_TAIL_BYTES}-byte cap"
        return {}, source, why + "; a cut log cannot be graded"
    found = parser.parse(run.log)
    return found, source, None if found else f"the {parser.name} parser found no test in it"


async def run_swebench_check(
    sandbox: Sandbox, check: SweBenchCheck, name: str, preflight_problem: str | None = ""
) -> tuple[CheckResult, dict[str, float]]:
    """Place the tests, run them, grade; SweBenchEvalError when it cannot be done,
    AgentCausedEvalFailure when that is the agent's doing.

    `preflight_problem`: what `preflight` found before the agent (None: nothing, a
    placing failure or a run without a verdict now is the agent's doing); "" when no
    preflight ran (a failure is then ours, as nothing shows the agent caused it).
    """
    t0 = time.monotonic()
    try:
        parser = get_parser(check.log_parser)
    except KeyError as e:
        raise SweBenchEvalError(f"check {name}: {e.args[0]}") from None
    pytest = parser.name == "pytest"
    if preflight_problem:
        raise SweBenchEvalError(
            f"check {name}: before the agent ran, the test patch could not be placed "
            f"({preflight_problem})"
        )
    try:
        code, out = await _place_tests(sandbox, check, "write", stop_processes=True)
        if code != 0:
            if preflight_problem is None:
                what = (
                    "it changed the repository's git data"
                    if code in (3, 4)
                    else "its changes to the repository's files kept them from being written"
                )
                detail = (
                    "the test files could not be placed although they could before the "
                    f"agent ran: {what} (exit {code}): {out}"
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
        run = await _run_tests(sandbox, check, name, pytest)
    except SandboxError as e:
        raise SweBenchEvalError(f"check {name}: sandbox error {e!r}") from e
    found, source, missing = _verdict(run, pytest, parser)
    if missing is not None:
        detail = f"{shlex.quote(check.test_command)}; log tail: {_tail(run.log)}"
        if preflight_problem is None:
            raise AgentCausedEvalFailure(f"check {name}: no verdict, {missing}", detail)
        raise SweBenchEvalError(f"check {name}: no verdict, {missing}; {detail}")
    key = junit_address if source == "junit-xml" else str
    failing, tests, counts = grade(found, check.fail_to_pass, check.pass_to_pass, key)
    resolved = not failing
    summary = (
        f"resolved: {int(counts['fail_to_pass_passed'])}/{int(counts['fail_to_pass_total'])} "
        f"FAIL_TO_PASS, {int(counts['pass_to_pass_passed'])}/{int(counts['pass_to_pass_total'])} "
        f"PASS_TO_PASS passed (exit {run.exit_code}, read from {source})"
    )
    if not resolved:
        summary = "not " + summary
        summary += "; not passing: " + ", ".join(f"{t} {tests[t]}" for t in failing[:20])
    return CheckResult(
        name=name,
        kind=check.kind,
        passed=resolved,
        score=1.0 if resolved else 0.0,
        exit_code=run.exit_code,
        duration_s=round(time.monotonic() - t0, 3),
        detail=_tail(f"{summary}\n{run.log}"),
        tests=tests,
        source=source,
    ), counts
