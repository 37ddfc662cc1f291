"""Per-step output: the metrics line, the printed line and the reward curve."""

import math
from pathlib import Path

from schemas.training import FinalEval, StepMetrics

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "reward_curve.png"


def read_metrics(out: Path) -> list[StepMetrics]:
    path = out / METRICS_FILE
    if not path.exists():
        return []
    return [StepMetrics.model_validate_json(ln) for ln in path.read_text().splitlines() if ln]


def write_metrics(out: Path, metrics: list[StepMetrics]) -> None:
    """Rewrite the file whole (a resume drops a step that never completed)."""
    tmp = out / f".{METRICS_FILE}.tmp"
    tmp.write_text("".join(m.model_dump_json() + "\n" for m in metrics))
    tmp.replace(out / METRICS_FILE)


def fmt(value: float | None, digits: int = 3) -> str:
    """A metric for the step line; `-` where there is no value."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def step_line(m: StepMetrics) -> str:
    return (
        f"step {m.step} policy={m.policy} reward={fmt(m.reward_mean)} "
        f"heldout={fmt(m.heldout_reward)} agree_mean={m.agree_mean:.2e} "
        f"agree_max={m.agree_max:.2e} ratio={m.ratio_mean:.4f} "
        f"staleness={m.staleness_max} rollouts/s={m.rollouts_per_s:.2f}"
    )


def plot_curve(out: Path, metrics: list[StepMetrics], final: FinalEval | None = None) -> Path:
    """Reward mean ± std per step, held-out reward, and agreement (log scale).

    Step N's rewards are those of the policy that sampled step N; the final policy's
    held-out reward, when measured, is drawn at step N+1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [m.step for m in metrics]
    mean = [math.nan if m.reward_mean is None else m.reward_mean for m in metrics]
    std = [m.reward_std for m in metrics]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(steps, mean, marker="o", label="train reward (mean)")
    low = [a - b for a, b in zip(mean, std, strict=True)]
    high = [a + b for a, b in zip(mean, std, strict=True)]
    top.fill_between(steps, low, high, alpha=0.2)
    held = [(m.step, m.heldout_reward) for m in metrics if m.heldout_reward is not None]
    if final is not None and final.heldout_reward is not None and metrics:
        held.append((metrics[-1].step + 1, final.heldout_reward))
    if held:
        top.plot([s for s, _ in held], [h for _, h in held], marker="s", label="held-out reward")
    top.set_ylabel("reward")
    top.legend(loc="best")
    bottom.semilogy(steps, [max(m.agree_mean, 1e-12) for m in metrics], marker="o", label="mean")
    bottom.semilogy(steps, [max(m.agree_max, 1e-12) for m in metrics], marker="^", label="max")
    bottom.axhline(0.01, color="red", linestyle="--", linewidth=1, label="0.01")
    bottom.set_ylabel("|trainer − engine| logprob")
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.legend(loc="best")
    fig.tight_layout()
    path = out / CURVE_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
