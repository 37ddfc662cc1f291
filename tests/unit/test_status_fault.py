"""Whose fault a status is: the agent's (reward 0 or earned, trained on and in the group
baseline) or ours (masked). A sandbox the agent broke is the agent's, like a spent
budget; an evaluator that broke on an intact sandbox is ours."""

from __future__ import annotations

import pytest

from schemas.evaluation import EvaluationResult
from schemas.outcome import (
    SAMPLE_STATUSES,
    AgentResult,
    RolloutStatus,
    RunOutcome,
    final_status,
    run_status,
    sample_status,
)
from trainer.batch import prepare_batch

BROKEN = RolloutStatus.agent_broke_sandbox


def evaluation(status: str, reward: float | None, damage: str | None = None) -> EvaluationResult:
    return EvaluationResult(
        status=status,  # type: ignore[arg-type]
        reward=reward,
        verdict="error" if reward is None else "fail",
        reward_fn_version="eval2-x",
        error="check test could not run (exit 127)" if status != "ok" else None,
        damage=damage,
    )


def agent(timed_out: bool = False) -> AgentResult:
    return AgentResult(harness="command", harness_version="1", exit_code=0, timed_out=timed_out)


def test_an_evaluation_the_agent_broke_makes_the_rollout_its_zero() -> None:
    ev = evaluation("agent_broke_sandbox", 0.0, damage="/workspace is gone")
    assert run_status(agent(), ev) is BROKEN
    outcome = RunOutcome(status=BROKEN, harness="command", evaluation=ev)
    assert outcome.reward == 0.0
    assert outcome.problem is not None and "/workspace is gone" in outcome.problem


def test_the_budget_still_wins_and_a_broken_evaluator_stays_ours() -> None:
    ev = evaluation("agent_broke_sandbox", 0.0, damage="its disk is full")
    assert run_status(agent(timed_out=True), ev) is RolloutStatus.agent_timeout
    assert run_status(agent(), evaluation("eval_error", None)) is RolloutStatus.eval_error
    assert RunOutcome(status=RolloutStatus.eval_error, harness="c").reward is None


def test_a_run_ended_by_the_agent_breaking_its_sandbox_earns_zero_whatever_was_scored() -> None:
    """The runtime sets the status when the run itself failed (supervisor killed): an
    evaluation that ran earlier, with a reward, does not count."""
    ok = evaluation("ok", 1.0)
    outcome = RunOutcome(status=BROKEN, harness="command", evaluation=ok, error="agent: …")
    assert outcome.reward == 0.0 and outcome.problem == "agent: …"
    assert final_status(BROKEN, ["agent_broke_sandbox"]) is BROKEN


@pytest.mark.parametrize(
    ("run", "row"),
    [
        (BROKEN, BROKEN),
        (RolloutStatus.agent_timeout, RolloutStatus.agent_timeout),
        (RolloutStatus.eval_error, RolloutStatus.infra_error),
        (RolloutStatus.infra_error, RolloutStatus.infra_error),
    ],
)
def test_rows_of_the_agents_fault_are_trainable_and_ours_are_masked(
    run: RolloutStatus, row: RolloutStatus
) -> None:
    got = sample_status(run, calls_complete=True, calls_ok=True, hit_token_limit=False)
    assert got is row and got in SAMPLE_STATUSES
    # A failed engine call is ours whatever the rollout did.
    assert (
        sample_status(run, calls_complete=True, calls_ok=False, hit_token_limit=False)
        is RolloutStatus.infra_error
    )


def test_the_reference_trainer_trains_them_and_counts_them_in_the_baseline() -> None:
    """Rewards 1 (ok) and 0 (broke its sandbox) → mean 0.5: the breaker gets a negative
    advantage; an infra_error row (reward unknown) is neither trained nor in the mean."""

    def row(rollout: str, reward: float, status: str) -> dict[str, object]:
        return {
            "rollout_id": rollout,
            "segment_id": "s0",
            "group_id": "g",
            "prompt_ids": [1],
            "response_ids": [2, 3],
            "loss_mask": [1, 1],
            "logprobs": [-0.5, -0.5],
            "reward": reward,
            "status": status,
            "policy_version": "v3",
        }

    batch = prepare_batch(
        [row("a", 1.0, "ok"), row("b", 0.0, "agent_broke_sandbox"), row("c", 0.0, "infra_error")],
        current_version=3,
        max_staleness=1,
        eps=0.0,
    )
    by_id = {r.rollout_id: r for r in batch.rows}
    assert by_id["b"].trained and by_id["b"].advantage == -1.0
    assert by_id["a"].advantage == 1.0
    assert not by_id["c"].trained and batch.infra_error == 1
