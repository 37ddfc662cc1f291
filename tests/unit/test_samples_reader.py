"""The samples reader `rollout show` and the viewer share: rows written by the collect
step's own row builder, read back as a batch and as one rollout; older files, missing
artifacts and paths that are no samples directory."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from activities.samples import build_rows
from rollout_client.samples_reader import NotASamplesDirectoryError, NotFoundError, SamplesReader
from rollout_client.storage import write_table
from schemas.evaluation import CheckResult, EvaluationResult
from schemas.outcome import ArtifactRef, RolloutStatus, RunOutcome
from schemas.rollout import CollectRequest
from schemas.samples import CHECK_DETAIL_CHARS, SCHEMA_VERSION, rows_to_table
from tests.unit.test_schemas import as_version
from tests.unit.test_workflow_samples import call, request, segment, trajectory

NOT_FOUND = "sh: 1: python: not found"


def _request(rid: str, batch: str, task: str, outcome: RunOutcome) -> CollectRequest:
    req = request()
    return req.model_copy(
        update={"rollout_id": rid, "batch_id": batch, "task_id": task, "outcome": outcome}
    )


def _rows(rid: str, batch: str, task: str, outcome: RunOutcome) -> list:
    calls = [call("c1", "g1"), call("c2", "g1").model_copy(update={"policy_version": "pol-4"})]
    seg = segment("g1", ["c1", "c2"]).model_copy(update={"call_starts": [0, 3]})
    traj = trajectory(calls, [seg]).model_copy(update={"rollout_id": rid})
    return build_rows(traj, _request(rid, batch, task, outcome))


def ok_outcome(artifacts_dir: str) -> RunOutcome:
    evaluation = EvaluationResult(
        status="ok",
        reward=1.0,
        verdict="pass",
        reward_fn_version="eval-9",
        duration_s=0.4,
        checks=[
            CheckResult(
                name="tests",
                kind="command",
                passed=True,
                score=1.0,
                exit_code=0,
                detail="2 passed",
                source="junit-xml",
            )
        ],
    )
    return RunOutcome(
        status=RolloutStatus.ok,
        harness="command",
        evaluation=evaluation,
        timings={"setup": 0.5, "agent": 3.25, "after_run": 0.6},
        artifacts_dir=artifacts_dir,
        artifacts=[
            ArtifactRef(
                name="evaluation.json",
                kind="evaluation",
                local_path=f"{artifacts_dir}/evaluation.json",
            ),
            ArtifactRef(name="diff.patch", kind="diff", local_path=f"{artifacts_dir}/diff.patch"),
            ArtifactRef(name="agent.log", kind="log", uri="s3://logs/r/agent.log"),
        ],
    )


def eval_error_outcome(detail: str = NOT_FOUND) -> RunOutcome:
    evaluation = EvaluationResult(
        status="eval_error",
        reward=None,
        verdict="error",
        reward_fn_version="eval-9",
        error=f"check 'tests' could not run (exit 127)\n{NOT_FOUND}",
        checks=[
            CheckResult(
                name="tests",
                kind="command",
                passed=False,
                score=0.0,
                exit_code=127,
                duration_s=0.01,
                detail=detail,
            )
        ],
    )
    return RunOutcome(status=RolloutStatus.eval_error, harness="command", evaluation=evaluation)


@pytest.fixture
def batch_dir(tmp_path: Path) -> Path:
    """<out>/b1/: one ok rollout, one eval_error, and one the manifest alone knows."""
    out = tmp_path / "b1"
    worker = "/srv/worker/artifacts/b1-hello-0/attempt-1"
    for rid, task, outcome in (
        ("b1-hello-0", "hello", ok_outcome(worker)),
        ("b1-py-0", "py", eval_error_outcome()),
    ):
        write_table(rows_to_table(_rows(rid, "b1", task, outcome)), str(out / f"{rid}.parquet"))
    manifest = {
        "batch_id": "b1",
        "rollouts": [
            {"rollout_id": "b1-hello-0", "workflow_status": "COMPLETED",
             "result": {"status": "ok", "duration_s": 9.5}},
            {"rollout_id": "b1-gone-0", "workflow_status": "FAILED",
             "error": "provision_sandbox: image not found\nTraceback…"},
        ],
    }  # fmt: skip
    (out / "_manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_batch_shows_statuses_rewards_and_errors_by_first_line(batch_dir: Path) -> None:
    for path in (batch_dir, batch_dir.parent):  # the batch's dir, or the --out above it
        view = SamplesReader(path).batch("b1")
        assert [r.rollout_id for r in view.rollouts] == ["b1-gone-0", "b1-hello-0", "b1-py-0"]
        assert view.status_counts() == {"FAILED": 1, "ok": 1, "eval_error": 1}
        assert view.rewards_by_task() == {"hello": [1.0]}
        errors = view.errors()
        assert list(errors) == [
            "provision_sandbox: image not found",
            "check 'tests' could not run (exit 127)",
        ]
        by_id = {r.rollout_id: r for r in view.rollouts}
        assert (by_id["b1-py-0"].whose, by_id["b1-py-0"].reward) == ("evaluator", None)
        assert (by_id["b1-hello-0"].whose, by_id["b1-hello-0"].reward) == ("", 1.0)
        assert by_id["b1-hello-0"].duration_s == 9.5  # from the manifest
        assert [r.rollout_id for r in view.slowest(1)] == ["b1-hello-0"]
        hello = by_id["b1-hello-0"]
        assert (hello.calls, hello.response_tokens, hello.trained_tokens) == (2, 5, 4)
        assert hello.policy_versions == ["pol-3", "pol-4"] and view.schema_versions == [
            SCHEMA_VERSION
        ]


def test_a_rollout_shows_checks_steps_calls_and_artifacts(batch_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "worker"
    (data / "artifacts" / "b1-hello-0" / "attempt-1").mkdir(parents=True)
    (data / "artifacts" / "b1-hello-0" / "attempt-1" / "evaluation.json").write_text("{}")
    reader = SamplesReader(batch_dir.parent, artifacts=data)
    assert reader.kind_of("b1") == "batch" and reader.kind_of("b1-py-0") == "rollout"
    hello = reader.rollout("b1-hello-0")
    assert hello.step_durations == {"setup": 0.5, "agent": 3.25, "after_run": 0.6, "evaluate": 0.4}
    assert [(c.name, c.passed, c.exit_code, c.detail, c.source) for c in hello.checks] == [
        ("tests", True, 0, "2 passed", "junit-xml")
    ]
    [seg] = hello.segment_views
    assert [(c.policy_version, c.tokens, c.trained_tokens) for c in seg.calls] == [
        ("pol-3", 3, 2),
        ("pol-4", 2, 2),
    ]
    states = {a.name: a.state for a in hello.artifacts}
    assert states == {"evaluation.json": "present", "diff.patch": "missing", "agent.log": "remote"}
    assert hello.missing == [] and hello.artifacts_dir.endswith("b1-hello-0/attempt-1")
    py = reader.rollout("b1-py-0")
    assert (py.status, py.whose, py.verdict) == ("eval_error", "evaluator", "error")
    assert NOT_FOUND in py.reason and py.checks[0].detail == NOT_FOUND
    assert py.checks[0].exit_code == 127
    assert {a.state for a in SamplesReader(batch_dir).rollout("b1-hello-0").artifacts} == {
        "not looked",
        "remote",
    }
    gone = reader.rollout("b1-gone-0")  # no samples: what the manifest says
    assert gone.status == "FAILED" and gone.reason.startswith("provision_sandbox")


def test_a_check_detail_keeps_its_capped_tail(tmp_path: Path) -> None:
    detail = "x" * 10_000 + NOT_FOUND
    rows = _rows("b2-py-0", "b2", "py", eval_error_outcome(detail))
    write_table(rows_to_table(rows), str(tmp_path / "b2" / "b2-py-0.parquet"))
    [check] = SamplesReader(tmp_path).rollout("b2-py-0").checks
    assert len(check.detail) == CHECK_DETAIL_CHARS and check.detail.endswith(NOT_FOUND)
    assert check.detail.startswith("…")


def test_a_v5_directory_shows_what_it_has(tmp_path: Path) -> None:
    rows = _rows("b3-py-0", "b3", "py", eval_error_outcome())
    (tmp_path / "b3").mkdir()
    pq.write_table(as_version(rows_to_table(rows), 5, []), tmp_path / "b3" / "b3-py-0.parquet")
    py = SamplesReader(tmp_path).rollout("b3-py-0")
    assert py.schema_version == 5 and not py.status_recorded
    # v5 rows knew only the masked row status and the reason
    assert (py.status, py.whose, py.checks) == ("infra_error", "infrastructure", [])
    assert NOT_FOUND in py.reason
    assert py.missing == [
        "rollout status",
        "evaluation checks",
        "step durations",
        "artifacts",
        "conversation",
        "routed experts",
    ]


def test_a_bad_file_is_named_and_the_rest_shows(batch_dir: Path) -> None:
    (batch_dir / "b1-junk-0.parquet").write_bytes(b"not parquet")
    view = SamplesReader(batch_dir).batch()
    assert list(view.unreadable) == [str(batch_dir / "b1-junk-0.parquet")]
    assert {r.rollout_id for r in view.rollouts} == {"b1-gone-0", "b1-hello-0", "b1-py-0"}


def test_several_batches_are_named_and_unknown_ids_refused(batch_dir: Path) -> None:
    other = batch_dir.parent / "b9"
    rows = _rows("b9-hello-0", "b9", "hello", ok_outcome("/w"))
    write_table(rows_to_table(rows), str(other / "b9-hello-0.parquet"))
    reader = SamplesReader(batch_dir.parent)
    assert reader.batch_ids() == ["b1", "b9"]
    with pytest.raises(NotFoundError, match=r"holds 2 batches; name one of \['b1', 'b9'\]"):
        reader.batch()
    with pytest.raises(NotFoundError, match="no rollout or batch 'nope'"):
        reader.kind_of("nope")


@pytest.mark.parametrize("what", ["missing", "empty", "file", "other files"])
def test_a_path_that_is_no_samples_directory_is_refused(tmp_path: Path, what: str) -> None:
    path = tmp_path / "p"
    if what == "empty":
        path.mkdir()
    elif what == "file":
        path.write_text("x")
    elif what == "other files":
        (path / "sub").mkdir(parents=True)
        (path / "notes.txt").write_text("x")
    with pytest.raises(NotASamplesDirectoryError, match=r"expected <rollout_id>\.parquet"):
        SamplesReader(path)
