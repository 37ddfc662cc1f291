"""The trainer's torch math against hand-computed values: the clipped loss, which tokens
it clips and where gradients flow, log-prob positions, and the agreement report that
names the token where trainer and engine differ. Runs in the trainer environment
(torch lives there, not in the project's)."""

import math
from pathlib import Path

import pytest

from tests.fixtures.trainer import TrainerPython

LOSS_SNIPPET = """
import json, math, torch
from trainer.loss import clipped_loss
ratios = [1.5, 0.5, 1.1, 1.0, 0.5]
new = torch.tensor([math.log(r) for r in ratios], requires_grad=True)
old = torch.zeros(5)
adv = torch.tensor([1.0, 1.0, -1.0, -2.0, -1.0])
mask = torch.tensor([1, 1, 1, 0, 1])
loss, stats = clipped_loss(new, old, adv, mask, {low}, {high})
loss.backward()
print(json.dumps({{"loss": float(loss), "clip": stats.clip_fraction, "tokens": stats.tokens,
                   "grad": new.grad.tolist()}}))
"""


def test_clipped_loss_hand_computed(trainer_env: TrainerPython) -> None:
    """clip 0.2: token 1 (ratio 1.5, A=+1) is capped at 1.2; token 2 (0.5, +1) keeps 0.5
    (min of 0.5 and 0.8); token 3 (1.1, −1) is inside the range: −1.1; token 4 is masked;
    token 5 (0.5, −1) is capped at −0.8. Loss = −(1.2 + 0.5 − 1.1 − 0.8)/4 = 0.05.
    Clipped tokens get no gradient; the others get −A·ratio/4."""
    got = trainer_env.run_json(LOSS_SNIPPET.format(low=0.2, high=0.2))
    assert got["loss"] == pytest.approx(0.05, abs=1e-6)
    assert got["clip"] == pytest.approx(0.5)
    assert got["tokens"] == 4
    assert got["grad"] == pytest.approx([0.0, -0.125, 0.275, 0.0, 0.0], abs=1e-6)


def test_clip_range_can_be_asymmetric(trainer_env: TrainerPython) -> None:
    """clip_high 0.6: token 1's ratio 1.5 is now inside (1.5 counted, gradient −1.5/4);
    the rest as before. Loss = −(1.5 + 0.5 − 1.1 − 0.8)/4 = −0.025, one token clipped."""
    got = trainer_env.run_json(LOSS_SNIPPET.format(low=0.2, high=0.6))
    assert got["loss"] == pytest.approx(-0.025, abs=1e-6)
    assert got["clip"] == pytest.approx(0.25)
    assert got["grad"] == pytest.approx([-0.375, -0.125, 0.275, 0.0, 0.0], abs=1e-6)


POSITION_SNIPPET = """
import json, torch
from pathlib import Path
from trainer.policy import load_policy
from trainer.loss import response_logprobs, agreement
from trainer.batch import TrainRow
model = load_policy(Path({model!r})).eval()
prompt, response = [11, 12, 13, 14], [21, 22, 23]
with torch.no_grad():
    fast = response_logprobs(model, prompt, response).tolist()
    slow = []
    for i, tok in enumerate(response):
        logits = model(input_ids=torch.tensor([prompt + response[:i]])).logits[0, -1]
        slow.append(float(torch.log_softmax(logits.float(), -1)[tok]))
engine = list(fast)
engine[1] -= 0.5
row = TrainRow("r1", "seg-7", "g", prompt, response, [1, 1, 0], engine, 1.0, 0.0, 0, True)
masked = list(fast)
masked[2] += 3.0
row2 = TrainRow("r2", "seg-8", "g", prompt, response, [1, 1, 0], masked, 1.0, 0.0, 0, True)
a = agreement(model, [row, row2])
older = load_policy(Path({model!r})).eval()
with torch.no_grad():
    for p in older.parameters():
        p.add_(0.05)
    old_lp = response_logprobs(older, prompt, response).tolist()
spanning = [old_lp[0], fast[1], fast[2]]  # token 0 by the older weights, then the update
row3 = TrainRow("r3", "seg-9", "g", prompt, response, [1, 1, 1], spanning, 1.0, 0.0, 1, True)
only_new = agreement(model, [row3])
both = agreement(model, [row3], (older,))
print(json.dumps({{"fast": fast, "slow": slow, "mean": a.mean, "max": a.max,
                   "ratio": a.ratio_mean, "tokens": a.tokens,
                   "worst": a.worst.model_dump(),
                   "gap": abs(old_lp[0] - fast[0]), "only_new_max": only_new.max,
                   "both_max": both.max, "by_older": both.by_alternative,
                   "both_ratio": both.ratio_mean, "only_new_ratio": only_new.ratio_mean}}))
"""


def test_logprob_positions_and_agreement_report(
    trainer_env: TrainerPython, tiny_model_dir: Path
) -> None:
    """One forward pass gives the same log-probs as scoring each response token after
    its own prefix (no off-by-one). An engine log-prob 0.5 off on token 1 of segment
    seg-7 shows up as max 0.5, mean 0.5/4 over the four loss-mask tokens, and the report
    names that segment, position and token; a difference on a masked token does not
    count; a row spanning a weight update is explained token by token by the two
    candidate weights."""
    got = trainer_env.run_json(POSITION_SNIPPET.format(model=str(tiny_model_dir)))
    assert got["fast"] == pytest.approx(got["slow"], abs=1e-5)
    assert got["max"] == pytest.approx(0.5, abs=1e-5)
    assert got["mean"] == pytest.approx(0.125, abs=1e-5)
    assert got["tokens"] == 4
    assert got["ratio"] == pytest.approx((3 + math.exp(0.5)) / 4, abs=1e-5)
    worst = got["worst"]
    assert (worst["rollout_id"], worst["segment_id"], worst["position"], worst["token_id"]) == (
        "r1",
        "seg-7",
        1,
        22,
    )
    assert worst["trainer_logprob"] - worst["engine_logprob"] == pytest.approx(0.5, abs=1e-5)
    # A row that spans a weight update: token 0 sampled by older weights. Against the
    # current weights alone it differs by the update's effect; with the older weights
    # as a candidate every token is explained and one is attributed to them. The ratio
    # stays the current weights' (the ones being trained).
    assert got["gap"] > 1e-3
    assert got["only_new_max"] == pytest.approx(got["gap"], abs=1e-5)
    assert got["both_max"] < 1e-5
    assert got["by_older"] == 1
    assert got["both_ratio"] == pytest.approx(got["only_new_ratio"], abs=1e-6)


OPTIMIZER_SNIPPET = """
import json, types, torch
from schemas.training import TrainConfig
from trainer.loop import Trainer
moved = {{}}
for eps in (1e-8, 1e-3):
    weights = torch.nn.Parameter(torch.zeros(2))
    cfg = TrainConfig(tasks="t", out="o", init_policy="p", engines=["http://e"], lr=1e-3,
                      adam_eps=eps)
    host = types.SimpleNamespace(cfg=cfg, model=types.SimpleNamespace(parameters=lambda: [weights]))
    optimizer = Trainer._optimizer(host)
    weights.grad = torch.tensor([1.0, 1e-5])  # a real signal, and noise
    optimizer.step()
    moved[str(eps)] = weights.detach().abs().tolist()
print(json.dumps(moved))
"""


def test_adam_eps_decides_whether_noise_moves_as_far_as_signal(
    trainer_env: TrainerPython,
) -> None:
    """The trainer's optimizer takes `adam_eps`: with the default 1e-8 its first step moves
    a parameter whose gradient is 1e-5 (noise) by the full lr, like the one with a real
    gradient; with 1e-3 the noisy one moves 100x less and the real one still by lr."""
    got = trainer_env.run_json(OPTIMIZER_SNIPPET.format())
    assert got["1e-08"] == pytest.approx([1e-3, 1e-3], rel=0.01)
    signal, noise = got["0.001"]
    assert signal == pytest.approx(1e-3, rel=0.01)
    assert noise == pytest.approx(1e-5, rel=0.01)
