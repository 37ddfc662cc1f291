"""The session-create activity's pure rules: which gateway errors a retry can fix, the
idempotency key (one per workflow run and attempt) and the TTLs derived from the budget."""

import pytest

from activities.session import control_error, idempotency_key, session_ttls
from gateway.control_client import GatewayControlError
from schemas.rollout import BAD_TASK_SPEC, SessionRequest
from schemas.sampling import SamplingParams
from schemas.session import SessionConfig
from schemas.tasks import HarnessSpec, RolloutBudget


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (409, "conflict"),  # served by another process, closed or expired: a state
        (503, "overloaded"),
        (500, "internal"),
        (429, "overloaded"),
        (408, None),
    ],
)
def test_transient_gateway_errors_are_retryable(status: int, code: str | None) -> None:
    err = control_error("create session", GatewayControlError(status, "x", code))
    assert err.type == "GatewayUnavailable" and not err.non_retryable


@pytest.mark.parametrize(
    ("status", "code"),
    [(409, "idempotency_mismatch"), (400, "invalid_request"), (401, "authentication")],
)
def test_request_errors_are_not_retryable(status: int, code: str) -> None:
    err = control_error("create session", GatewayControlError(status, "x", code))
    assert err.type == BAD_TASK_SPEC and err.non_retryable


def test_key_differs_per_run_and_attempt_and_fits_the_field() -> None:
    keys = {
        idempotency_key("r1", "run-a", 1),
        idempotency_key("r1", "run-a", 2),
        idempotency_key("r1", "run-b", 1),
    }
    assert len(keys) == 3
    long_id = "r" * 400  # RolloutRequest allows 400 characters, the key field 256
    key = idempotency_key(long_id, "run-a", 1)
    assert key.startswith("run-a/attempt-1/") and len(key) == 256
    SessionConfig(rollout_id="r", idempotency_key=key)


def test_ttls_follow_the_budget() -> None:
    budget = RolloutBudget(
        total_s=1000, grace_s=50, provision_s=100, setup_s=20, hooks_s=30, collect_s=10
    )
    request = SessionRequest(
        rollout_id="r",
        attempt=1,
        policy_version="v",
        sampling=SamplingParams(),
        harness=HarnessSpec(name="command", budget_s=200),
        budget=budget,
    )
    idle, absolute = session_ttls(request)
    assert absolute == 1000 + 50 + 60  # the whole budget, its grace and the slack
    assert idle == 100 + 20 + 30 + 200 + 50 + 60  # before the first call + the agent
    short = request.model_copy(update={"budget": budget.model_copy(update={"total_s": 100})})
    assert session_ttls(short) == (100 + 50 + 60, 100 + 50 + 60)  # idle never past absolute
