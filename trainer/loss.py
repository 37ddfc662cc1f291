"""Log-probabilities, the PPO-style clipped loss and train–inference agreement (torch).

The behaviour policy is the engine: its recorded `logprobs` for the sampled tokens.
Log-probs are taken from the raw logits (vLLM's default `raw_logprobs`), so both sides
mean log softmax of the model's logits, temperature not applied.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from schemas.training import TokenMismatch
from trainer.batch import TrainRow


def response_logprobs(
    model: torch.nn.Module, prompt_ids: list[int], response_ids: list[int]
) -> torch.Tensor:
    """log p(response_ids[i] | prompt_ids + response_ids[:i]) for every i, one forward pass.

    One unpadded sequence at a time: padding and attention masks change the kernels'
    arithmetic, and exact agreement with the engine is the point.
    """
    ids = torch.tensor([prompt_ids + response_ids], dtype=torch.long)
    logits = model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1
    scores = F.log_softmax(logits[start : start + len(response_ids)], dim=-1)
    target = torch.tensor(response_ids, dtype=torch.long)
    return scores.gather(1, target[:, None])[:, 0]


@dataclass
class Agreement:
    """|trainer − engine| over loss-mask tokens, before any update of the step.

    `by_alternative` counts tokens sampled by other weights than the primary ones (the
    older policy, in a rollout that spanned a weight update).
    """

    mean: float
    max: float
    ratio_mean: float
    tokens: int
    worst: TokenMismatch | None
    by_alternative: int = 0


def agreement(
    model: torch.nn.Module,
    rows: list[TrainRow],
    alternatives: tuple[torch.nn.Module, ...] = (),
    by_version: dict[str, torch.nn.Module] | None = None,
) -> Agreement:
    """Each token's difference is taken against the weights that sampled it: with
    `by_version`, those of the token's recorded version (`TrainRow.token_versions`; a
    version not in it means `model`); else whichever of `model` and `alternatives`
    matches the engine best. The ratio is always `model`'s, the weights about to be
    trained."""
    diffs: list[torch.Tensor] = []
    ratios: list[torch.Tensor] = []
    worst: TokenMismatch | None = None
    worst_diff = -1.0
    by_alternative = 0
    with torch.no_grad():
        for row in rows:
            mask = torch.tensor(row.loss_mask, dtype=torch.bool)
            if not mask.any():
                continue
            old = torch.tensor(row.logprobs, dtype=torch.float32)
            new = response_logprobs(model, row.prompt_ids, row.response_ids)
            best, diff = new, (new - old).abs()
            if by_version is not None and row.token_versions:
                best, sampled_by_other = _by_version(model, row, new, by_version)
                diff = (best - old).abs()
                by_alternative += int((sampled_by_other & mask).sum())
            for alt in alternatives if by_version is None else ():
                other = response_logprobs(alt, row.prompt_ids, row.response_ids)
                other_diff = (other - old).abs()
                closer = other_diff < diff
                by_alternative += int((closer & mask).sum())
                best = torch.where(closer, other, best)
                diff = torch.minimum(diff, other_diff)
            masked = torch.where(mask, diff, torch.zeros_like(diff))
            pos = int(masked.argmax())
            if float(masked[pos]) > worst_diff:
                worst_diff = float(masked[pos])
                worst = TokenMismatch(
                    rollout_id=row.rollout_id,
                    segment_id=row.segment_id,
                    position=pos,
                    token_id=row.response_ids[pos],
                    trainer_logprob=float(best[pos]),
                    engine_logprob=float(old[pos]),
                )
            diffs.append(diff[mask])
            ratios.append(torch.exp(new - old)[mask])
    if not diffs:
        return Agreement(0.0, 0.0, 1.0, 0, None)
    d, r = torch.cat(diffs), torch.cat(ratios)
    return Agreement(
        float(d.mean()), float(d.max()), float(r.mean()), int(d.numel()), worst, by_alternative
    )


def _by_version(
    model: torch.nn.Module,
    row: TrainRow,
    new: torch.Tensor,
    by_version: dict[str, torch.nn.Module],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's logprob under the weights of its recorded version, and which tokens
    another model than `model` sampled."""
    best = new.clone()
    other = torch.zeros(len(row.response_ids), dtype=torch.bool)
    for version in dict.fromkeys(row.token_versions):
        weights = by_version.get(version, model)
        if weights is model:
            continue
        where = torch.tensor([v == version for v in row.token_versions], dtype=torch.bool)
        logprobs = response_logprobs(weights, row.prompt_ids, row.response_ids)
        best = torch.where(where, logprobs, best)
        other |= where
    return best, other


@dataclass
class LossStats:
    loss: float
    clip_fraction: float
    tokens: int


def clipped_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, LossStats]:
    """PPO clipped surrogate, averaged over the masked tokens of the whole batch.

    All four tensors are flat and aligned (one entry per response token); `advantages`
    holds each token's row advantage. Token-level averaging weighs every trained token
    alike, so long responses are not diluted.
    """
    mask = mask.to(new_logprobs.dtype)
    ratio = torch.exp(new_logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    n = mask.sum().clamp(min=1.0)
    loss = (per_token * mask).sum() / n
    # the clipped term is the active one (it caps the objective): no gradient there
    was_clipped = ((clipped < unclipped) & (mask > 0)).float().sum() / n
    return loss, LossStats(float(loss.detach()), float(was_clipped), int(mask.sum()))


def batch_loss(
    model: torch.nn.Module, rows: list[TrainRow], clip_low: float, clip_high: float
) -> tuple[torch.Tensor, LossStats]:
    """The clipped loss of every trained row with gradients through `model`."""
    news, olds, advs, masks = [], [], [], []
    for row in rows:
        news.append(response_logprobs(model, row.prompt_ids, row.response_ids))
        olds.append(torch.tensor(row.logprobs, dtype=torch.float32))
        advs.append(torch.full((len(row.response_ids),), row.advantage, dtype=torch.float32))
        masks.append(torch.tensor(row.loss_mask, dtype=torch.float32))
    return clipped_loss(
        torch.cat(news), torch.cat(olds), torch.cat(advs), torch.cat(masks), clip_low, clip_high
    )
