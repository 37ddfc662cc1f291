"""The warm tiny model: a random build plus a supervised warm-up, cached by recipe hash.

:func:`ensure_warm_model` returns ``<cache>/tiny-warm-<hash>``, building it when missing by
running :mod:`warmup` with a Python that has torch and transformers (the vLLM CPU venv);
this module itself needs neither, so the main environment stays torch-free. The hash
covers the random model's fingerprint (tokenizer and template), the task family, the
warm-up code, the recipe and the torch/transformers versions that train it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from .builder import (
    WARM_SOURCES,
    default_cache_dir,
    ensure_tiny_model,
    publish_cached,
    source_fingerprint,
)
from .tasks import HELDOUT_SEED, HELDOUT_SIZE
from .weights import TinyQwen3Shape


class WarmupRecipe(BaseModel):
    """Everything that shapes the warm model; its hash names the cache directory."""

    shape: TinyQwen3Shape = TinyQwen3Shape(
        hidden_size=192,
        num_attention_heads=3,
        num_key_value_heads=1,
        num_hidden_layers=3,
        intermediate_size=384,
    )
    seed: int = 0
    steps: int = 900
    batch_short: int = 32
    batch_tool: int = 12
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    key_weight: float = 5.0
    """Loss weight of the tokens that carry the task (answer, tool argument) vs format."""
    style_steps: int = 200
    """The most steps of a second phase after ``steps``: conversations where
    ``verbose_fraction`` of the final answers are verbose ("The answer is 7."), which the
    check rejects. It gives the model one format habit shared by every task -- the room RL
    has: the skills alone left it little (sharpening a memorised table barely transfers to
    held-out facts). A phase of its own because mixing the style in from the start slowed
    the skills down (600 mixed steps: held-out add 0.17 vs 0.72 after 400 terse ones).
    The phase lowers the held-out expected reward from about 0.5 and ends as soon as it
    is inside ``target_band`` (see :func:`style_stop`)."""
    style_lr: float = 1e-3
    verbose_fraction: float = 0.85
    target_band: tuple[float, float] = (0.16, 0.21)
    """Where the style phase stops, in held-out expected reward (mean). Floating point
    differs across CPUs, so a fixed step count lands at a different reward on each
    machine; stopping on the measured reward makes the band the recipe's, not the CPU's.
    Inside the 0.15-0.6 RL needs, and around the 0.16-0.19 from which the demo's
    training rose by about 0.2 (more verbose habit left means more room to rise)."""
    style_eval_every: int = 4
    """Held-out evaluation interval in the style phase."""
    style_min_steps: int = 48
    """Style steps before the phase may stop. Its first steps are a shock (loss ~4, the
    held-out reward falls from ~0.5 to ~0.07 and swings back): a stop there would keep
    a model whose verbose habit is barely formed."""
    threads: int = 1
    """One thread: on a shared 2-core box, two OpenMP threads run ~3x slower, not faster."""
    heldout_seed: int = HELDOUT_SEED
    heldout_excluded: int = HELDOUT_SIZE
    """The first N held-out cases of ``heldout_seed`` never appear in the warm-up data."""


StopReason = Literal["in_band", "step_cap"]


def style_evaluates(step: int, recipe: WarmupRecipe) -> bool:
    """Whether the style phase evaluates the held-out reward after ``step`` (0-based):
    every ``style_eval_every`` of its steps, and its last allowed one."""
    if step < recipe.steps:
        return False
    done = step - recipe.steps + 1
    return done % recipe.style_eval_every == 0 or done >= recipe.style_steps


def style_stop(step: int, heldout_mean: float | None, recipe: WarmupRecipe) -> StopReason | None:
    """Why the warm-up ends after ``step``, or None to go on.

    Only the style phase stops early (the skills phase passes through the band on its
    way up), and only after ``style_min_steps`` of it: ``in_band`` when the held-out
    expected reward measured after ``step`` is inside ``target_band``, ``step_cap``
    after ``style_steps`` steps without that. A reward below the band does not stop
    it: from one evaluation to the next the reward swings by up to ~0.07 and comes
    back into the band.
    """
    if step < recipe.steps:
        return None
    done = step - recipe.steps + 1
    low, high = recipe.target_band
    ready = done >= min(recipe.style_min_steps, recipe.style_steps)
    if ready and heldout_mean is not None and low <= heldout_mean <= high:
        return "in_band"
    return "step_cap" if done >= recipe.style_steps else None


class WarmModelError(RuntimeError):
    """The warm-up subprocess failed."""


def _trainer_versions(python: Path) -> str:
    probe = (
        "from importlib.metadata import version as v; "
        "print(v('torch'), v('transformers'), v('tokenizers'))"
    )
    out = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True, env=subprocess_env()
    )
    return out.stdout.strip()


def warm_fingerprint(recipe: WarmupRecipe, python: Path) -> str:
    digest = hashlib.sha256(source_fingerprint().encode())
    for name in WARM_SOURCES:
        digest.update(name.encode())
        digest.update(resources.files(__package__).joinpath(name).read_bytes())
    # The training text is rendered in the Gateway's Jinja environment.
    digest.update(resources.files("gateway.prompt").joinpath("jinja_env.py").read_bytes())
    digest.update(recipe.model_dump_json().encode())
    digest.update(_trainer_versions(python).encode())
    return digest.hexdigest()[:16]


def _project_root() -> Path:
    """The directory holding the ``devstack`` package (for the subprocess' PYTHONPATH)."""
    return Path(str(resources.files(__package__))).parent.parent


def subprocess_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env.update(
        PYTHONPATH=str(_project_root()),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def build_warm_model(
    out_dir: Path, python: Path, recipe: WarmupRecipe | None = None, base: Path | None = None
) -> Path:
    """Train into ``out_dir`` with ``python`` (torch + transformers); the log is kept there."""
    recipe = recipe or WarmupRecipe()
    base = base or ensure_tiny_model()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), "-m", f"{__package__}.warmup", "--base", str(base), "--out", str(out_dir)]
    cmd += ["--recipe", recipe.model_dump_json()]
    with (out_dir / "warmup.log").open("w") as log:
        code = subprocess.run(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=subprocess_env(),
        ).returncode
    if code != 0:
        tail = (out_dir / "warmup.log").read_text(errors="replace").splitlines()[-30:]
        raise WarmModelError(f"warm-up failed (exit {code}):\n" + "\n".join(tail))
    return out_dir


def ensure_warm_model(
    python: Path, cache_dir: Path | None = None, recipe: WarmupRecipe | None = None
) -> Path:
    """The cached warm model for ``recipe``, trained first if missing (minutes on CPU).

    Trains in a temporary sibling and renames it into place, like the random model.
    """
    recipe = recipe or WarmupRecipe()
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / f"tiny-warm-{warm_fingerprint(recipe, python)}"
    if (target / "model.safetensors").exists():
        return target
    base = ensure_tiny_model(root)

    def build(tmp: Path) -> None:
        build_warm_model(tmp, python, recipe, base)
        (tmp / "recipe.json").write_text(json.dumps(recipe.model_dump(), indent=2) + "\n")

    return publish_cached(target, build)
