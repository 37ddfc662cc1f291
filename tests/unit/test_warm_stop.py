"""The warm-up's stopping rule on synthetic held-out curves (no training, no torch).

The style phase lowers the held-out expected reward; where it stands after a fixed step
count depends on the CPU's floating point. The rule stops on the measured value, so
curves that fall faster or slower all end inside the recipe's band.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devstack.tiny_model import warm
from devstack.tiny_model.warm import WarmupRecipe, style_evaluates, style_stop

RECIPE = WarmupRecipe()


def run(recipe: WarmupRecipe, curve: Callable[[int], float]) -> tuple[int, str, list[int]]:
    """The decisions :func:`warmup.train` takes, step by step, on ``curve`` (held-out
    mean after each step): (stop step, reason, steps evaluated in the style phase)."""
    evaluated: list[int] = []
    for step in range(recipe.steps + recipe.style_steps):
        mean = curve(step) if style_evaluates(step, recipe) else None
        if mean is not None:
            evaluated.append(step)
        reason = style_stop(step, mean, recipe)
        if reason:
            return step, reason, evaluated
    raise AssertionError("the rule never stopped")


def falling(rate: float) -> Callable[[int], float]:
    """Rises to 0.5 over the skills phase (through the band); in the style phase a shock
    dips through and below the band for 20 steps, then the reward declines from 0.3 by
    ``rate`` per step -- the shape the real warm-up has, faster or slower by CPU."""

    def mean(step: int) -> float:
        if step < RECIPE.steps:
            return 0.5 * step / RECIPE.steps
        done = step - RECIPE.steps + 1
        if done <= 20:
            return 0.5 - 0.02 * done
        return 0.3 - rate * (done - 20)

    return mean


RATES = (0.0008, 0.0015, 0.003)


@pytest.mark.parametrize("rate", RATES)
def test_curves_that_fall_at_different_speeds_all_stop_inside_the_band(rate: float) -> None:
    curve = falling(rate)
    step, reason, evaluated = run(RECIPE, curve)
    low, high = RECIPE.target_band
    assert reason == "in_band"
    assert low <= curve(step) <= high
    assert step == evaluated[-1] and (step - RECIPE.steps + 1) % RECIPE.style_eval_every == 0
    assert step - RECIPE.steps + 1 >= RECIPE.style_min_steps
    late = [s for s in evaluated[:-1] if s - RECIPE.steps + 1 >= RECIPE.style_min_steps]
    assert all(curve(s) > high for s in late)


def test_the_stop_step_follows_the_curve_not_a_fixed_count() -> None:
    """Control for the test above: the three speeds stop at three different steps."""
    stops = {run(RECIPE, falling(rate))[0] for rate in RATES}
    assert len(stops) == 3


def test_the_shock_at_the_start_of_the_style_phase_does_not_stop_it() -> None:
    """Control for the minimum: without it the shock's dip through the band would stop
    the phase in its first steps."""
    curve = falling(0.0015)
    shock = [s for s in range(RECIPE.steps, RECIPE.steps + 20) if style_evaluates(s, RECIPE)]
    assert any(RECIPE.target_band[0] <= curve(s) <= RECIPE.target_band[1] for s in shock)
    assert run(RECIPE.model_copy(update={"style_min_steps": 0}), curve)[0] in shock
    assert run(RECIPE, curve)[0] not in shock


def test_the_skills_phase_never_stops_even_inside_the_band() -> None:
    assert all(style_stop(s, 0.2, RECIPE) is None for s in (0, 400, RECIPE.steps - 1))
    assert not any(style_evaluates(s, RECIPE) for s in range(RECIPE.steps))
    first = RECIPE.steps + RECIPE.style_min_steps - 1
    assert style_stop(first - 1, 0.2, RECIPE) is None
    assert style_stop(first, 0.2, RECIPE) == "in_band"


def test_a_curve_that_stays_above_the_band_stops_at_the_cap() -> None:
    step, reason, evaluated = run(RECIPE, lambda s: 0.3)
    assert (step, reason) == (RECIPE.steps + RECIPE.style_steps - 1, "step_cap")
    assert evaluated[-1] == step


def test_an_odd_cap_is_still_evaluated_at_its_last_step() -> None:
    recipe = RECIPE.model_copy(update={"style_steps": 10})
    step, reason, evaluated = run(recipe, lambda s: 0.3)
    assert (step, reason) == (recipe.steps + 9, "step_cap")
    assert evaluated == [recipe.steps + 3, recipe.steps + 7, recipe.steps + 9]


def test_a_swing_below_the_band_goes_on_until_the_reward_is_back_inside() -> None:
    """The real style phase swings by several hundredths between evaluations; an
    evaluation below the band is not a stop."""
    first = RECIPE.steps + RECIPE.style_min_steps - 1

    def swing(step: int) -> float:
        return 0.12 if step < first + 8 else 0.19

    step, reason, _ = run(RECIPE, swing)
    assert (step, reason) == (first + 8, "in_band")


def test_a_curve_that_stays_below_the_band_stops_at_the_cap() -> None:
    step, reason, _ = run(RECIPE, lambda s: 0.1)
    assert (step, reason) == (RECIPE.steps + RECIPE.style_steps - 1, "step_cap")


def test_the_band_and_the_interval_are_part_of_the_cache_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm, "_trainer_versions", lambda python: "torch transformers tokenizers")
    python = Path("/unused")
    keys = {
        warm.warm_fingerprint(r, python)
        for r in (
            RECIPE,
            RECIPE.model_copy(update={"target_band": (0.16, 0.22)}),
            RECIPE.model_copy(update={"style_eval_every": 5}),
            RECIPE.model_copy(update={"style_min_steps": 40}),
        )
    }
    assert len(keys) == 4
    assert warm.warm_fingerprint(RECIPE, python) == warm.warm_fingerprint(RECIPE, python)
