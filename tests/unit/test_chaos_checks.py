"""The chaos run's checker against corrupted input: a sample row wrong in each way the
checker guards, segments and turns written twice, turns and rollouts missing.

Rows are built the way the workflow writes them (`SampleRow` → `rows_to_table`, so
the column types are the parquet file's: int8 masks, float32 logprobs) and read back as
`run_chaos` reads them (`to_pylist`); the engine's answers are the scripted engine's
log records (`ScriptedReply`)."""

from pathlib import Path
from typing import Any

import pytest

from devstack.scripted_engine import ScriptedReply
from rollout_client.client import RolloutOutcome
from schemas.rollout import RolloutResult
from schemas.samples import SampleRow, rows_to_table
from stress.chaos import check_outcomes, check_samples, engine_index, row_problem

PROMPT = [1, 2, 3]
#: Two turns: the engine answered [10, 11] to PROMPT, then [20] to the first turn plus
#: the tool's tokens [7, 8].
FIRST = ScriptedReply(
    prompt_ids=PROMPT, output_ids=[10, 11], output_logprobs=[-0.5, -0.25],
    finish_reason="stop", rule=None,
)  # fmt: skip
SECOND = ScriptedReply(
    prompt_ids=[*PROMPT, 10, 11, 7, 8], output_ids=[20], output_logprobs=[-0.125],
    finish_reason="stop", rule=None,
)  # fmt: skip
ENGINE = engine_index([FIRST, SECOND])


def row(rollout_id: str = "r1", segment_id: str = "s0", **change: Any) -> dict[str, Any]:
    """A row of two turns, as read back from a samples file."""
    fields: dict[str, Any] = {
        "rollout_id": rollout_id,
        "task_id": "t",
        "group_id": "g",
        "segment_id": segment_id,
        "scene": "main",
        "prompt_ids": PROMPT,
        "response_ids": [10, 11, 7, 8, 20],
        "loss_mask": [1, 1, 0, 0, 1],
        "logprobs": [-0.5, -0.25, 0.0, 0.0, -0.125],
        "reward": 1.0,
        "status": "ok",
        "policy_version": "chaos-v0",
        "env_version": "e",
        "prompt_template_version": "p",
        "reward_fn_version": "f",
        "harness": "command",
        "harness_version": "1",
        "sampling": "{}",
    }
    [read] = rows_to_table([SampleRow.model_validate(fields)]).to_pylist()
    return read | change


def test_a_row_the_engine_sampled_passes() -> None:
    assert row_problem(row(), ENGINE) is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"loss_mask": None}, "missing loss_mask"),
        ({"logprobs": None, "status": None}, "missing status, logprobs"),
        ({"loss_mask": [1, 1, 0, 0]}, "loss_mask 4, logprobs 5 for 5 response tokens"),
        ({"logprobs": [-0.5, -0.25]}, "loss_mask 5, logprobs 2 for 5 response tokens"),
        ({"loss_mask": [1, 1, 0, 0, 2]}, "loss_mask holds [2]"),
        ({"loss_mask": [0, 0, 0, 0, 0]}, "no sampled token (loss_mask has no 1)"),
        ({"response_ids": [], "loss_mask": [], "logprobs": []}, "no sampled token"),
        # the second turn's logprob moved onto a tool token: spans and logprobs disagree
        ({"logprobs": [-0.5, -0.25, -0.125, 0.0, 0.0]}, "logprobs on unsampled tokens at [2]"),
        # a tool token marked sampled: the span [10, 11, 7] is no answer of the engine
        (
            {"loss_mask": [1, 1, 1, 0, 1]},
            "tokens 0:3: not an answer the engine gave to that prompt",
        ),
        ({"response_ids": [10, 12, 7, 8, 20]}, "tokens 0:2: not an answer the engine gave"),
        ({"prompt_ids": [1, 2, 4]}, "tokens 0:2: the engine was never asked the tokens"),
        ({"response_ids": [10, 11, 7, 9, 20]}, "tokens 4:5: the engine was never asked"),
        (
            {"logprobs": [-0.5, -0.25, 0.0, 0.0, -0.5]},
            "tokens 4:5: logprobs differ from the engine's",
        ),
        ({"status": "infra_error"}, "3 trained tokens in an infra_error row"),
    ],
)
def test_each_corruption_of_a_row_is_named(change: dict[str, Any], problem: str) -> None:
    found = row_problem(row(**change), ENGINE)
    assert found is not None and found.startswith(problem), found


def test_a_masked_row_trains_nothing_and_is_not_held_to_the_engine() -> None:
    """`infra_error` rows keep their tokens and logprobs but no loss mask (the workflow
    masks them): nothing of them is trained, so nothing is checked against the engine."""
    masked = row(status="infra_error", loss_mask=[0, 0, 0, 0, 0], response_ids=[99] * 5)
    assert row_problem(masked, ENGINE) is None


def result(rollout_id: str, samples: Path | None, **change: Any) -> RolloutOutcome:
    fields: dict[str, Any] = {
        "rollout_id": rollout_id,
        "batch_id": "b",
        "task_id": "t",
        "group_id": "g",
        "sample_index": 0,
        "status": "ok",
        "reward": 1.0,
        "samples_uri": str(samples) if samples else None,
        "agent_exit_code": 0,
        "harness": "command",
        "harness_version": "1",
        "policy_version": "chaos-v0",
    }
    return RolloutOutcome(
        rollout_id=rollout_id,
        workflow_status="COMPLETED",
        result=RolloutResult.model_validate(fields | change),
    )


def test_outcomes_lost_failed_gave_up_and_complete(tmp_path: Path) -> None:
    """A rollout still running, one whose workflow ended without result or error, one
    whose samples file is not there: lost. A workflow failure: failed. An agent that
    exited 1: gave up (its samples are not held to every turn); a masked rollout is not
    complete either. Only ok rollouts with their samples must hold every turn."""
    written = tmp_path / "r.parquet"
    written.write_bytes(b"")
    outcomes: dict[str, RolloutOutcome | None] = {
        "running": None,
        "vanished": RolloutOutcome(rollout_id="vanished", workflow_status="TERMINATED"),
        "failed": RolloutOutcome(rollout_id="failed", workflow_status="FAILED", error="boom"),
        "no-file": result("no-file", tmp_path / "gone.parquet"),
        "no-uri": result("no-uri", None),
        "quit": result("quit", written, agent_exit_code=1),
        "masked": result("masked", written, status="infra_error", attempts=3),
        "good": result("good", written, attempts=2),
    }
    checked = check_outcomes(outcomes)
    assert checked.lost == ["running", "vanished", "no-file", "no-uri"]
    assert checked.failed == ["failed"]
    assert checked.gave_up == ["quit"]
    assert checked.complete == ["good"]
    assert checked.retried == {"masked": 3, "good": 2}
    assert checked.statuses == {
        "still running": 1, "workflow terminated": 1, "workflow failed": 1,
        "ok": 4, "infra_error": 1,
    }  # fmt: skip


def test_clean_samples_count_nothing() -> None:
    checked = check_samples([row("r1"), row("r2")], ENGINE, ["r1", "r2"], turns=2)
    assert (checked.samples, checked.sampled_turns) == (2, 4)
    assert (checked.duplicated, checked.tokens_differ, checked.turns_missing) == (0, 0, 0)
    assert checked.details == []


def test_a_segment_written_twice_is_duplicated() -> None:
    checked = check_samples([row("r1"), row("r1")], ENGINE, ["r1"], turns=2)
    # the same segment twice: one extra segment, and each of its two turns twice
    assert (checked.duplicated, checked.tokens_differ, checked.turns_missing) == (3, 0, 0)
    assert "r1/s0: written 2 times" in checked.details
    assert "r1: 2 turn(s) recorded twice" in checked.details


def test_a_turn_recorded_in_two_segments_is_duplicated() -> None:
    """Two segments of one rollout that both hold the first turn (a retried call
    recorded again in a new segment)."""
    again = row("r1", "s1", response_ids=[10, 11], loss_mask=[1, 1], logprobs=[-0.5, -0.25])
    checked = check_samples([row("r1"), again], ENGINE, ["r1"], turns=2)
    assert (checked.duplicated, checked.tokens_differ) == (1, 0)
    assert checked.details == ["r1: 1 turn(s) recorded twice"]


def test_missing_turns_and_a_missing_rollout_are_counted() -> None:
    """r1 holds one of its two turns; r2 (complete: its agent ran to the end) has no row
    at all."""
    first_only = row("r1", response_ids=[10, 11], loss_mask=[1, 1], logprobs=[-0.5, -0.25])
    checked = check_samples([first_only], ENGINE, ["r1", "r2"], turns=2)
    assert checked.turns_missing == 1 + 2
    assert checked.details == ["r1: 1 of 2 turns in its samples", "r2: 0 of 2 turns in its samples"]


def test_rows_the_engine_did_not_sample_are_counted_with_why() -> None:
    rows = [row("r1"), row("r2", loss_mask=[0, 0, 0, 0, 0]), row("r3", loss_mask=None)]
    checked = check_samples(rows, ENGINE, ["r1"], turns=2)
    assert checked.tokens_differ == 2
    assert checked.details == [
        "r2/s0: no sampled token (loss_mask has no 1)",
        "r3/s0: missing loss_mask",
    ]
    assert checked.sampled_turns == 2  # r1's; the broken rows add none
