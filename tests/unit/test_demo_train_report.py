"""What `rollout demo --train` concludes from OUT: the starting policy's held-out reward
is step 1's (sampled by v0), the end is the trained policy's (`final_heldout.json`), and
a gain of exactly 0.15 counts even when float subtraction lands just below it."""

from pathlib import Path

from schemas.training import FinalEval, StepMetrics
from workers.demo_train import summarise, verdict


def _step(step: int, heldout: float, agree: float) -> StepMetrics:
    zero = dict.fromkeys(
        ("rollout_s", "train_s", "publish_s", "step_s", "rollouts_per_s", "loss"), 0.0
    )
    return StepMetrics(
        step=step,
        policy=f"r-v{step}",
        sampled_by=f"r-v{step - 1}",
        rollouts=4,
        rollouts_ok=4,
        rows=4,
        rows_trained=4,
        rows_infra_error=0,
        rows_stale=0,
        tokens_trained=10,
        reward_mean=0.5,
        reward_std=0.1,
        heldout_reward=heldout,
        agree_mean=agree,
        agree_max=agree * 5,
        ratio_mean=1.0,
        staleness_max=0,
        staleness_mean=0.0,
        clip_fraction=0.0,
        grad_norm=0.1,
        **zero,
    )


def _write(out: Path, heldouts: list[float], final: float, agree: float = 1e-7) -> Path:
    out.mkdir()
    steps = [_step(i + 1, h, agree) for i, h in enumerate(heldouts)]
    (out / "metrics.jsonl").write_text("".join(m.model_dump_json() + "\n" for m in steps))
    last = FinalEval(policy=f"r-v{len(heldouts)}", heldout_reward=final, heldout_rollouts=8)
    (out / "final_heldout.json").write_text(last.model_dump_json())
    return out


def test_a_gain_of_exactly_the_target_counts(tmp_path: Path) -> None:
    assert 0.70 - 0.55 < 0.15
    result = summarise(_write(tmp_path / "run", [0.55, 0.1, 0.3], 0.70))
    assert (result.start_heldout, result.gain, result.learned) == (0.55, 0.15, True)
    assert verdict(result) == (
        "held-out reward: start 0.550 -> final 0.700 (+0.150); rose by >= 0.15: YES"
    )


def test_less_than_the_target_or_a_broken_agreement_is_reported(tmp_path: Path) -> None:
    result = summarise(_write(tmp_path / "run", [0.3, 0.5], 0.44, agree=0.02))
    assert (result.gain, result.learned, result.agreement_ok) == (0.14, False, False)
    assert verdict(result).endswith("(+0.140); rose by >= 0.15: NO")
