"""The `evaluate` hook's Harbor verifier (`RewardFileCheck`) on an in-memory sandbox:
its environment, Harbor's reward-file precedence, the declared range, and whose failure
a verifier that gave no reward is (by the oracle's evidence)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from hooks.evaluate import VERIFIER_ENV, evaluate
from sandboxes.base import ExecResult
from schemas.evaluation import EvaluationSpec
from tests.fixtures.fake_sandbox import FakeSandbox

REWARD_DIR = "/logs/verifier"
EVIDENCE = {"rollout_id": "oracle-1", "reward": 1.0, "image_digest": "fake:1"}


def spec(**check: Any) -> EvaluationSpec:
    return EvaluationSpec.model_validate(
        {
            "checks": [{"kind": "reward_file", "name": "v", **check}],
            "files": [{"path": "/tests/test.sh", "content": "true\n"}],
            "aggregate": "sum",
        }
    )


def verifier(writes: dict[str, str], result: ExecResult | None = None) -> FakeSandbox:
    """A sandbox whose `bash /tests/test.sh` writes `writes` (name → content) into the
    reward dir and returns `result` (default: exit 0)."""
    sb = FakeSandbox()

    def handler(cmd: str, kw: dict[str, Any]) -> ExecResult | None:
        if "bash /tests/test.sh" in cmd:
            for name, content in writes.items():
                sb.files[f"{REWARD_DIR}/{name}"] = content.encode()
            return result or ExecResult(exit_code=0)
        return None

    sb.handler = handler
    return sb


def verifier_env(sb: FakeSandbox) -> dict[str, str]:
    [cmd] = [c for c, _ in sb.calls if "bash /tests/test.sh" in c]
    argv = shlex.split(cmd)
    return dict(a.split("=", 1) for a in argv[3 : argv.index("/bin/sh")])


async def test_the_verifier_runs_with_the_workdir_unable_to_steer_python_uv_or_pip() -> None:
    sb = verifier({"reward.txt": "1"})
    r = await evaluate(sb, spec(), "/workspace")
    assert (r.status, r.reward) == ("ok", 1.0)
    env = verifier_env(sb)
    assert {k: env[k] for k in VERIFIER_ENV} == {
        "PYTHONSAFEPATH": "1",
        "UV_NO_CONFIG": "1",
        "PIP_CONFIG_FILE": "/dev/null",
    }


async def test_the_tasks_verifier_env_overrides_the_isolation() -> None:
    sb = verifier({"reward.txt": "1"})
    await evaluate(sb, spec(env={"PYTHONSAFEPATH": "", "X": "1"}), "/workspace")
    env = verifier_env(sb)
    assert env["PYTHONSAFEPATH"] == "" and env["X"] == "1" and env["UV_NO_CONFIG"] == "1"


async def test_reward_txt_wins_and_the_json_metrics_stay() -> None:
    sb = verifier({"reward.json": '{"reward": 1.0, "passed": 2}', "reward.txt": "0"})
    r = await evaluate(sb, spec(), "/workspace")
    assert (r.status, r.reward, r.metrics) == ("ok", 0.0, {"passed": 2.0})
    [check] = r.checks
    assert check.source == "reward.txt" and not check.passed
    assert "reward.json says reward=1.0; reward.txt decides" in check.detail


async def test_reward_json_alone_is_the_source() -> None:
    sb = verifier({"reward.json": '{"reward": 0.5}'})
    r = await evaluate(sb, spec(), "/workspace")
    assert (r.status, r.reward, r.checks[0].source) == ("ok", 0.5, "reward.json")


@pytest.mark.parametrize("written", ["1e308", "-5", "2.0", "1e999"])
async def test_a_reward_out_of_range_is_the_agents_failure(written: str) -> None:
    sb = verifier({"reward.txt": written})
    r = await evaluate(sb, spec(), "/workspace")
    assert (r.status, r.reward, r.verdict) == ("agent_broke_sandbox", 0.0, "fail"), r
    damage = r.damage or ""
    assert "outside the task's range [0.0, 1.0]" in damage, damage
    assert "the code it ran did" in damage, damage


async def test_a_declared_range_holds_the_datasets_scale() -> None:
    sb = verifier({"reward.txt": "7.5"})
    r = await evaluate(sb, spec(reward_range=(0, 10)), "/workspace")
    assert (r.status, r.reward) == ("ok", 7.5)
    sb = verifier({"reward.txt": "10.5"})
    r = await evaluate(sb, spec(reward_range=(0, 10)), "/workspace")
    assert (r.status, r.reward) == ("agent_broke_sandbox", 0.0)


NO_REWARD = [
    ({}, None, "wrote neither reward.txt nor reward.json"),
    ({"reward.txt": "passed"}, None, "not one number"),
    ({}, ExecResult(exit_code=137, timed_out=True), "timed out after 300.0s"),
]


@pytest.mark.parametrize(("writes", "result", "why"), NO_REWARD)
async def test_no_reward_from_a_verifier_the_oracle_showed_working_is_the_agents_failure(
    writes: dict[str, str], result: ExecResult | None, why: str
) -> None:
    sb = verifier(writes, result)
    r = await evaluate(sb, spec(shown_working=EVIDENCE), "/workspace")
    assert (r.status, r.reward) == ("agent_broke_sandbox", 0.0), r
    damage = r.damage or ""
    assert why in damage and "oracle rollout oracle-1, reward 1.0" in damage, damage


@pytest.mark.parametrize(("writes", "result", "why"), NO_REWARD)
async def test_control_without_evidence_no_reward_stays_ours_and_says_how_to_show_it(
    writes: dict[str, str], result: ExecResult | None, why: str
) -> None:
    sb = verifier(writes, result)
    r = await evaluate(sb, spec(), "/workspace")
    assert (r.status, r.reward, r.damage) == ("eval_error", None, None), r
    error = r.error or ""
    assert why in error and "--harness oracle" in error, error


async def test_evidence_from_another_image_does_not_cover_this_sandbox() -> None:
    sb = verifier({})
    evidence = {**EVIDENCE, "image_digest": "sha256:other"}
    r = await evaluate(sb, spec(shown_working=evidence), "/workspace")
    assert (r.status, r.reward) == ("eval_error", None), r
    assert "shown working on image sha256:other, not on this sandbox's fake:1" in (r.error or "")


async def test_evidence_of_a_built_image_covers_any_host() -> None:
    sb = verifier({})
    evidence = {**EVIDENCE, "image_digest": None}
    r = await evaluate(sb, spec(shown_working=evidence), "/workspace")
    assert (r.status, r.reward) == ("agent_broke_sandbox", 0.0), r


def test_the_evidence_is_not_part_of_the_reward_function_version() -> None:
    assert spec().reward_fn_version() == spec(shown_working=EVIDENCE).reward_fn_version()
    assert spec().reward_fn_version() != spec(reward_range=(0, 10)).reward_fn_version()
