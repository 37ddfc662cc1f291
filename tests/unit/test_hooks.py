"""Unit tests for hooks: ordering, on_error, evaluate (reward 0 vs eval_error), metrics,
log collection and artifact upload to a local directory — on an in-memory sandbox."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hooks.base import (
    HookContext,
    HookError,
    build_hooks,
    run_on_error,
    run_phase,
)
from hooks.collect_logs import collect_log_files
from hooks.evaluate import _isolated, evaluate
from sandboxes.base import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    EVALUATOR_PATH,
    ArchiveTooLarge,
    ExecResult,
    SandboxError,
)
from schemas.evaluation import EvaluationResult, EvaluationSpec
from schemas.outcome import AgentResult, LogSpec, RunOutcome
from schemas.tasks import HookSpec, RolloutTask
from tests.fixtures.fake_sandbox import FakeSandbox, Handler
from tests.fixtures.hooks import EVENTS


def hook_ctx(
    tmp_path: Path,
    sb: FakeSandbox | None = None,
    *,
    evaluation: EvaluationSpec | None = None,
    evaluation_result: EvaluationResult | None = None,
    **outcome: Any,
) -> HookContext:
    task = RolloutTask(
        task_id="t-1", prompt="p", harness={"name": "command"}, evaluation=evaluation
    )
    return HookContext(
        rollout_id="r-1",
        task=task,
        sandbox=sb or FakeSandbox(),
        workdir="/workspace",
        artifacts_dir=tmp_path / "artifacts",
        outcome=RunOutcome(harness="command", evaluation=evaluation_result, **outcome),
    )


@pytest.fixture(autouse=True)
def _clear_events() -> None:
    EVENTS.clear()


async def test_hooks_run_in_list_order_per_phase(tmp_path: Path) -> None:
    hooks = build_hooks([HookSpec(name="test_recorder", params={"tag": t}) for t in "abc"])
    ctx = hook_ctx(tmp_path)
    await run_phase(hooks, "before_run", ctx)
    await run_phase(hooks, "after_run", ctx)
    assert [f"{t}.{p}" for p in ("before_run", "after_run") for t in "abc"] == EVENTS


async def test_required_hook_failure_raises_and_on_error_runs_all(tmp_path: Path) -> None:
    hooks = build_hooks(
        [
            HookSpec(name="test_recorder", params={"tag": "a"}),
            HookSpec(name="test_recorder", params={"tag": "b", "fail_in": "after_run"}),
            HookSpec(name="test_recorder", params={"tag": "c", "fail_in": "on_error"}),
        ]
    )
    ctx = hook_ctx(tmp_path)
    with pytest.raises(HookError, match="b fails") as exc:
        await run_phase(hooks, "after_run", ctx)
    assert EVENTS == ["a.after_run", "b.after_run"]  # c never ran
    await run_on_error(hooks, ctx, exc.value)
    # Every on_error runs, in order; c's own failure is recorded, not raised.
    assert EVENTS[2:] == ["a.on_error", "b.on_error", "c.on_error"]
    assert ctx.error is exc.value
    assert any("c fails in on_error" in e for e in ctx.outcome.hook_errors)


async def test_a_required_hook_failing_after_the_evaluation_is_recorded_not_raised(
    tmp_path: Path,
) -> None:
    """An evaluation once in the outcome stands: a later required hook's failure (logs,
    metrics, an upload) is recorded, the hooks after it still run."""
    hooks = build_hooks(
        [
            HookSpec(name="test_recorder", params={"tag": "a", "fail_in": "after_run"}),
            HookSpec(name="test_recorder", params={"tag": "b"}),
        ]
    )
    evaluation = EvaluationResult(status="ok", reward=1.0, verdict="pass", reward_fn_version="v")
    ctx = hook_ctx(tmp_path, evaluation_result=evaluation)
    await run_phase(hooks, "after_run", ctx)
    assert EVENTS == ["a.after_run", "b.after_run"]
    assert ctx.outcome.evaluation is evaluation
    assert ctx.outcome.hook_errors == [
        "test_recorder.after_run: RuntimeError('a fails in after_run')"
    ]
    # Control: the same failure with no evaluation yet fails the phase.
    with pytest.raises(HookError, match="a fails"):
        await run_phase(hooks, "after_run", hook_ctx(tmp_path))


async def test_optional_hook_failure_is_recorded_and_the_next_hook_runs(tmp_path: Path) -> None:
    hooks = build_hooks(
        [
            HookSpec(
                name="test_recorder", params={"tag": "a", "fail_in": "after_run"}, required=False
            ),
            HookSpec(name="test_recorder", params={"tag": "b"}),
        ]
    )
    ctx = hook_ctx(tmp_path)
    await run_phase(hooks, "after_run", ctx)
    assert EVENTS == ["a.after_run", "b.after_run"]
    assert len(ctx.outcome.hook_errors) == 1


def test_unknown_hook_and_bad_params_fail_when_building() -> None:
    with pytest.raises(KeyError, match="unknown hook"):
        build_hooks([HookSpec(name="nope")])
    with pytest.raises(ValueError):
        build_hooks([HookSpec(name="evaluate", params={"spec": {"checks": []}})])
    with pytest.raises(ValueError):
        build_hooks([HookSpec(name="upload_artifacts", params={})])  # dest is required


# --------------------------------------------------------------------------- evaluate


def results(**by_cmd: ExecResult):  # type: ignore[no-untyped-def]
    def handler(cmd: str, kw: dict[str, Any]) -> ExecResult | None:
        for key, res in by_cmd.items():
            if key.replace("_", " ") in cmd:
                return res
        return None

    return handler


async def test_failing_check_gives_reward_zero_not_an_error() -> None:
    sb = FakeSandbox(results(run_tests=ExecResult(exit_code=1, stdout="1 failed")))
    spec = EvaluationSpec.model_validate({"checks": [{"kind": "command", "command": "run tests"}]})
    r = await evaluate(sb, spec, "/workspace")
    assert r.status == "ok" and r.reward == 0.0 and r.verdict == "fail"
    assert r.checks[0].exit_code == 1 and "1 failed" in r.checks[0].detail


async def test_passing_check_gives_reward_one() -> None:
    sb = FakeSandbox(results(run_tests=ExecResult(exit_code=0)))
    spec = EvaluationSpec.model_validate({"checks": [{"kind": "command", "command": "run tests"}]})
    r = await evaluate(sb, spec, "/workspace")
    assert r.status == "ok" and r.reward == 1.0 and r.verdict == "pass"


@pytest.mark.parametrize(
    ("res", "why"),
    [
        (ExecResult(exit_code=127, stderr="sh: pytest: not found"), "could not run"),
        (ExecResult(exit_code=137, timed_out=True), "timed out"),
        (ExecResult(exit_code=4), "could not run"),  # configured as an evaluator error
    ],
)
async def test_broken_evaluator_gives_eval_error_and_no_reward(res: ExecResult, why: str) -> None:
    sb = FakeSandbox(results(run_tests=res))
    spec = EvaluationSpec.model_validate(
        {"checks": [{"kind": "command", "command": "run tests", "error_exit_codes": [4, 126, 127]}]}
    )
    r = await evaluate(sb, spec, "/workspace")
    assert r.status == "eval_error" and r.reward is None and r.verdict == "error"
    assert why in (r.error or "")
    # the check it stopped in is recorded: failed, how its command ended, and why
    [check] = r.checks
    assert (check.name, check.passed, check.score) == ("command0", False, 0.0)
    assert (check.exit_code, check.timed_out) == (
        None if res.timed_out else res.exit_code,
        res.timed_out,
    )
    assert why in check.detail and res.stderr in check.detail


def probe_finds(found: str | ExecResult | Exception) -> Handler:
    """The check cannot run (exit 127); the damage probe answers `found`."""

    def handler(cmd: str, kw: dict[str, Any]) -> ExecResult | None:
        if ".rollout-probe" not in cmd:
            return ExecResult(exit_code=127, stderr="exec failed: [Errno 2] /workspace")
        if isinstance(found, Exception):
            raise found
        return found if isinstance(found, ExecResult) else ExecResult(exit_code=0, stdout=found)

    return handler


@pytest.mark.parametrize(
    ("probe", "damage"),
    [
        ("/workspace is gone\n/tmp has no room for 65536 bytes (disk full)\n",
         "/workspace is gone; /tmp has no room for 65536 bytes (disk full)"),
        (ExecResult(exit_code=126, stderr="exec failed: [Errno 11] Resource unavailable"),
         "no process can start in it"),
        (ExecResult(exit_code=137, timed_out=True), "did not finish"),
    ],
)  # fmt: skip
async def test_a_check_that_fails_in_a_sandbox_the_agent_broke_scores_zero(
    probe: str | ExecResult, damage: str
) -> None:
    """Not a masked evaluator error: the agent's doing, reward 0, what it broke named."""
    spec = EvaluationSpec.model_validate({"checks": [{"kind": "command", "command": "run"}]})
    r = await evaluate(FakeSandbox(probe_finds(probe)), spec, "/workspace")
    assert r.status == "agent_broke_sandbox" and r.reward == 0.0 and r.verdict == "fail"
    assert r.damage is not None and damage in r.damage
    assert "could not run" in (r.error or "") and damage in (r.problem or "")


@pytest.mark.parametrize(
    "probe",
    ["", ExecResult(exit_code=2, stderr="sh: something odd"), SandboxError("backend API down")],
)
async def test_a_probe_that_finds_nothing_or_cannot_run_leaves_the_error_ours(
    probe: str | ExecResult | Exception,
) -> None:
    """An intact sandbox, or a probe that itself could not be carried out: a doubt
    stays ours (eval_error, masked)."""
    spec = EvaluationSpec.model_validate({"checks": [{"kind": "command", "command": "run"}]})
    r = await evaluate(FakeSandbox(probe_finds(probe)), spec, "/workspace")
    assert r.status == "eval_error" and r.reward is None and r.damage is None


async def test_reward_script_json_and_its_crash() -> None:
    spec = EvaluationSpec.model_validate(
        {
            "checks": [
                {
                    "kind": "script",
                    "script": "echo hi",
                    "interpreter": "python3",
                    "reward_from": "stdout_json",
                }
            ],
            "aggregate": "mean",
            "pass_threshold": 0.5,
        }
    )
    out = 'noise\n{"reward": 0.75, "step_rewards": [0, 1, 0.5]}\n'
    ok = await evaluate(
        FakeSandbox(results(python3=ExecResult(exit_code=0, stdout=out))), spec, "/w"
    )
    assert ok.status == "ok" and ok.reward == 0.75 and ok.step_rewards == [0, 1, 0.5]
    assert ok.verdict == "pass"
    crash = ExecResult(exit_code=1, stderr="Traceback ... ZeroDivisionError")
    bad = await evaluate(FakeSandbox(results(python3=crash)), spec, "/w")
    assert bad.status == "eval_error" and bad.reward is None
    garbage = ExecResult(exit_code=0, stdout="no json here")
    bad2 = await evaluate(FakeSandbox(results(python3=garbage)), spec, "/w")
    assert bad2.status == "eval_error" and "no reward JSON" in (bad2.error or "")
    # Output cut at the cap: its last line may be one the checked code printed.
    forged = ExecResult(exit_code=0, stdout='test output\n{"reward": 1.0}\n', truncated=True)
    cut = await evaluate(FakeSandbox(results(python3=forged)), spec, "/w")
    assert cut.status == "eval_error" and cut.reward is None
    assert "output cap" in (cut.error or "")
    whole = forged.model_copy(update={"truncated": False})
    assert (await evaluate(FakeSandbox(results(python3=whole)), spec, "/w")).reward == 1.0


async def test_file_checks_and_mean_aggregation() -> None:
    sb = FakeSandbox()
    sb.files["/workspace/out.txt"] = b"answer: 42\n"
    spec = EvaluationSpec.model_validate(
        {
            "checks": [
                {"kind": "file", "path": "out.txt", "equals": "answer: 42"},
                {"kind": "file", "path": "out.txt", "regex": r"answer: \d+$"},
                {"kind": "file", "path": "missing.txt"},
                {"kind": "file", "path": "secret.txt", "exists": False},
            ],
            "aggregate": "mean",
        }
    )
    r = await evaluate(sb, spec, "/workspace")
    assert [c.passed for c in r.checks] == [True, True, False, True]
    assert r.reward == 0.75 and r.step_rewards == [1.0, 1.0, 0.0, 1.0] and r.verdict == "fail"


def test_reward_fn_version_tracks_the_spec() -> None:
    a = EvaluationSpec.model_validate({"checks": [{"kind": "command", "command": "pytest"}]})
    b = EvaluationSpec.model_validate({"checks": [{"kind": "command", "command": "pytest -x"}]})
    assert a.reward_fn_version() == a.model_copy().reward_fn_version()
    assert a.reward_fn_version() != b.reward_fn_version()
    assert EvaluationSpec(checks=a.checks, version="v7").reward_fn_version() == "v7"


async def test_evaluate_hook_places_hidden_files_and_writes_its_result(tmp_path: Path) -> None:
    sb = FakeSandbox(results(pytest=ExecResult(exit_code=0)))
    spec = EvaluationSpec.model_validate(
        {
            "checks": [{"kind": "command", "command": "pytest tests/test_hidden.py"}],
            "files": [{"path": "tests/test_hidden.py", "content": "def test(): pass\n"}],
        }
    )
    ctx = hook_ctx(tmp_path, sb, evaluation=spec)
    [hook] = build_hooks([HookSpec(name="evaluate")])
    await hook.after_run(ctx)
    assert sb.files["/workspace/tests/test_hidden.py"] == b"def test(): pass\n"
    assert ctx.outcome.evaluation is not None and ctx.outcome.evaluation.reward == 1.0
    saved = json.loads((ctx.artifacts_dir / "evaluation.json").read_text())
    assert saved["reward"] == 1.0 and ctx.outcome.artifacts[0].kind == "evaluation"


# --------------------------------------------------------------------------- others


async def test_collect_logs_metrics_and_local_upload(tmp_path: Path) -> None:
    sb = FakeSandbox()
    sb.files["/home/agent/.rollout-agent/sessions/2026/a.jsonl"] = b'{"x":1}\n'
    sb.files["/home/agent/.rollout-agent/sessions/2026/skip.bin"] = b"\0"
    ctx = hook_ctx(
        tmp_path,
        sb,
        agent=AgentResult(harness="command", harness_version="v", exit_code=0),
        timings={"agent": 1.5},
    )
    dest = tmp_path / "store"
    hooks = build_hooks(
        [
            HookSpec(
                name="collect_logs",
                params={
                    "extra": [
                        {
                            "path": "/home/agent/.rollout-agent/sessions",
                            "patterns": ["*.jsonl"],
                            "kind": "transcript",
                        }
                    ]
                },
            ),
            HookSpec(name="metrics"),
            HookSpec(name="upload_artifacts", params={"dest": str(dest)}),
        ]
    )
    await run_phase(hooks, "after_run", ctx)
    assert ctx.outcome.agent is not None
    [log] = ctx.outcome.agent.logs
    assert log.kind == "transcript" and log.sandbox_path.endswith("2026/a.jsonl")
    assert Path(log.local_path or "").read_bytes() == b'{"x":1}\n'
    metrics = ctx.outcome.metrics
    assert metrics["agent.exit_code"] == 0 and metrics["time.agent_s"] == 1.5
    names = {a.name for a in ctx.outcome.artifacts}
    assert names == {"logs/transcript/sessions/2026/a.jsonl", "metrics.json"}
    for a in ctx.outcome.artifacts:
        assert a.uri and a.uri.startswith("file://")
        assert (dest / "r-1" / a.name).is_file()


SCRATCH = "/tmp/rollout-diff.abc"


def diff_sandbox(
    numstat: str, extra: dict[str, Callable[[], ExecResult]] | None = None
) -> FakeSandbox:
    """A sandbox answering capture_diff's steps: the baseline (its git dir lands in
    SCRATCH/git), the scratch dir, `numstat` for the diff, and `extra` by substring."""

    def handler(cmd: str, kw: dict[str, Any]) -> ExecResult | None:
        for key, answer in (extra or {}).items():
            if key in cmd:
                return answer()
        if "git diff" in cmd:
            return ExecResult(exit_code=0, stdout=numstat)
        if "git init" in cmd:
            return ExecResult(exit_code=0, stdout=f"abc123\n{SCRATCH}\n")
        if "mktemp -d /tmp/rollout-diff." in cmd:
            return ExecResult(exit_code=0, stdout=f"{SCRATCH}\n")
        return None

    sb = FakeSandbox(handler)
    sb.files[f"{SCRATCH}/git/HEAD"] = b"ref: refs/heads/master\n"
    return sb


async def test_capture_diff_parses_numstat(tmp_path: Path) -> None:
    sb = diff_sandbox("3\t0\thello.py\n-\t-\timg.png\n1\t2\tb.py\n")
    ctx = hook_ctx(tmp_path, sb)
    [hook] = build_hooks([HookSpec(name="capture_diff")])
    await hook.before_run(ctx)
    # The baseline git dir left the sandbox: it is kept on the host until the diff.
    del sb.files[f"{SCRATCH}/git/HEAD"]
    assert sb.kills == 0  # before the agent, nothing is killed
    sb.files[f"{SCRATCH}/diff.patch"] = b"diff --git a/hello.py b/hello.py\n"
    await hook.after_run(ctx)
    diff = ctx.outcome.diff
    assert diff is not None
    assert (diff.base, diff.files_changed, diff.insertions, diff.deletions) == (
        "abc123",
        3,
        4,
        2,
    )
    assert (ctx.artifacts_dir / "diff.patch").read_bytes().startswith(b"diff --git")
    assert sb.files[f"{SCRATCH}/git/HEAD"] == b"ref: refs/heads/master\n"  # put back
    [git] = [c for c, _ in sb.calls if "git diff" in c]
    assert git.startswith("/usr/bin/env -i -- ") and "GIT_CONFIG_GLOBAL=/dev/null" in git
    assert "--no-ext-diff --no-textconv" in git and f"GIT_DIR={SCRATCH}/git" in git
    assert sb.kills == 2  # before the scratch dir and before the diff


async def test_capture_diff_reads_a_huge_patch_only_up_to_its_cap(tmp_path: Path) -> None:
    """A patch far over `max_bytes` is cut inside the sandbox; the host reads only the
    head (about the cap), records the full size and marks the diff truncated."""
    full = b"+" * 500_000

    def cut() -> ExecResult:
        sb.files[f"{SCRATCH}/diff.patch.head"] = full[:1000]
        return ExecResult(exit_code=0, stdout=f"{len(full)}\n")

    sb = diff_sandbox("1\t0\tbig.txt\n", {f"head -c 1000 {SCRATCH}/diff.patch > ": cut})
    sb.files[f"{SCRATCH}/diff.patch"] = full
    ctx = hook_ctx(tmp_path, sb)
    [hook] = build_hooks([HookSpec(name="capture_diff", params={"max_bytes": 1000})])
    await hook.before_run(ctx)
    await hook.after_run(ctx)
    diff = ctx.outcome.diff
    assert diff is not None and diff.truncated and diff.bytes == len(full)
    assert (ctx.artifacts_dir / "diff.patch").read_bytes() == full[:1000]
    assert max(sb.delivered) < 100_000, sb.delivered


async def test_collect_logs_skips_a_location_over_its_cap_and_says_so(tmp_path: Path) -> None:
    sb = FakeSandbox()
    sb.files["/s/big/huge.log"] = b"x" * 300_000
    sb.files["/s/small/ok.log"] = b"fine"
    ctx = hook_ctx(tmp_path, sb)
    ctx.log_specs = [LogSpec(path="/s/big", kind="log"), LogSpec(path="/s/small", kind="log")]
    [hook] = build_hooks([HookSpec(name="collect_logs", params={"max_bytes": 100_000})])
    await hook.after_run(ctx)
    assert [a.name for a in ctx.outcome.artifacts] == [
        "logs/log/small/ok.log",
        "logs/collect_logs.json",
    ]
    assert ctx.outcome.hook_errors == [
        "collect_logs: skipped /s/big: archive of /s/big in the sandbox exceeds 100000 bytes "
        "(read stopped after 100000)"
    ]
    [skip] = json.loads((ctx.artifacts_dir / "logs/collect_logs.json").read_text())["skipped"]
    assert skip["sandbox_path"] == "/s/big" and skip["limit"] == "max_bytes"
    assert max(sb.delivered) <= 100_000


class _HugeFiles(FakeSandbox):
    """Every archive read is over its cap (as for a file of many gigabytes)."""

    async def get_archive(self, path: str, *, max_bytes: int = 0) -> bytes:
        self.delivered.append(max_bytes)
        raise ArchiveTooLarge(path, max_bytes, max_bytes)


async def test_file_check_on_a_file_over_the_cap_fails_with_the_reason() -> None:
    sb = _HugeFiles()
    spec = EvaluationSpec.model_validate({"checks": [{"kind": "file", "path": "answer.txt"}]})
    r = await evaluate(sb, spec, "/workspace")
    assert r.status == "ok" and r.reward == 0.0
    assert r.checks[0].detail == f"answer.txt is larger than {DEFAULT_MAX_ARCHIVE_BYTES} bytes"


async def test_script_check_script_arrives_on_stdin_not_at_a_guessable_path() -> None:
    sb = FakeSandbox(results(python3=ExecResult(exit_code=0)))
    spec = EvaluationSpec.model_validate(
        {"checks": [{"kind": "script", "script": "print(1)\n", "interpreter": "python3"}]}
    )
    r = await evaluate(sb, spec, "/workspace")
    assert r.reward == 1.0 and sb.files == {}
    [(cmd, kw)] = sb.calls
    assert kw["stdin"] == b"print(1)\n"
    runner = shlex.split(cmd)[-1]  # the clean room runs it: `... /bin/sh -c RUNNER`
    assert runner.startswith("d=$(mktemp -d) || exit 126;") and "/tmp/rollout-eval" not in cmd
    assert 'python3 -s "$d/script"' in runner  # no user site dir
    assert sb.kills == 1  # every process was killed before the check


async def test_checks_run_in_the_clean_room_with_their_own_env_on_top() -> None:
    sb = FakeSandbox()
    sb.handle.env.update(LD_PRELOAD="/x.so", PYTHONPATH="/w", TASK="t", HOME="/home/agent")
    spec = EvaluationSpec.model_validate(
        {
            "checks": [{"kind": "command", "command": "run", "env": {"PYTHONPATH": "/opt"}}],
            "files": [{"path": "t.sh", "content": "x"}],
        }
    )
    r = await evaluate(sb, spec, "/workspace")
    assert r.reward == 1.0
    [(cmd, _)] = sb.calls
    argv = shlex.split(cmd)
    assert argv[:3] == ["/usr/bin/env", "-i", "--"]
    env = dict(a.split("=", 1) for a in argv[3 : argv.index("/bin/sh")])
    assert env["PATH"] == EVALUATOR_PATH and env["PYTHONNOUSERSITE"] == "1"
    assert env["TASK"] == "t" and env["PYTHONPATH"] == "/opt"  # the check's own env
    assert "LD_PRELOAD" not in env and "HOME" not in env  # HOME: made fresh at run time
    assert argv[-3:] == ["/bin/sh", "-c", "run"]
    assert sb.kills == 2  # before the hidden files arrive, and before the check


async def test_collect_logs_never_writes_outside_its_destination(tmp_path: Any) -> None:
    sb = FakeSandbox()
    sb.files["/s/logs/ok.log"] = b"fine"
    sb.files["/s/logs/../../evil.log"] = b"escape"
    got = await collect_log_files(sb, tmp_path / "out", [LogSpec(path="/s/logs", kind="log")])
    assert [lf.sandbox_path for lf in got] == ["/s/logs/ok.log"]
    assert not list(tmp_path.glob("**/evil.log"))


async def test_capture_diff_on_error_keeps_the_partial_work(tmp_path: Path) -> None:
    """A run that failed after the agent started still records the agent's diff (it
    raised AttributeError on the outcome-less context before)."""
    sb = diff_sandbox("2\t1\thalf_done.py\n")
    ctx = hook_ctx(tmp_path, sb)
    [hook] = build_hooks([HookSpec(name="capture_diff")])
    await hook.before_run(ctx)
    sb.files[f"{SCRATCH}/diff.patch"] = b"diff --git a/half_done.py b/half_done.py\n"
    await hook.on_error(ctx, RuntimeError("agent crashed"))
    diff = ctx.outcome.diff
    assert diff is not None
    assert (diff.files_changed, diff.insertions, diff.deletions) == (1, 2, 1)


@pytest.mark.parametrize(
    ("interpreter", "run_as"),
    [
        ("python3", "python3 -s"),
        ("/usr/bin/python3.11 -u", "/usr/bin/python3.11 -s -u"),
        ("/usr/bin/env PYTHONPATH=. python3", "/usr/bin/env PYTHONPATH=. python3 -s"),
        ("/bin/sh", "/bin/sh"),
        ("bash -e", "bash -e"),
    ],
)
def test_a_python_interpreter_never_reads_its_user_site(interpreter: str, run_as: str) -> None:
    assert _isolated(interpreter) == run_as
