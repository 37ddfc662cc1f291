"""The trainer's Python environment: the vLLM CPU venv's torch/transformers plus the
few packages a trainer client needs (temporalio, pyarrow, matplotlib, boto3).

Why an overlay and not the vLLM venv itself: the vLLM venv is shared by every engine
process and its pins are vLLM's; installing client packages into it could move a
dependency under a running engine. The overlay is a small venv of its own whose
site-packages gets a ``.pth`` line pointing at the vLLM venv's site-packages, so torch
and transformers are used in place (no second 800 MB copy) and only the missing
packages are installed, constrained to the versions the vLLM venv already has (pip
sees them through the ``.pth`` and installs nothing it already satisfies).

Why not our package installed into it: the trainer imports only ``schemas``,
``rollout_client``, ``trainer`` and the gateway's vLLM weight loader
(``gateway.engines.vllm_weights``, when it loads weights without a gateway; import
contracts), so :func:`trainer_pythonpath` links exactly those package directories into a
small directory put on ``PYTHONPATH`` — ``gateway`` there holds only its ``engines`` — so
the code that runs is always the code of this checkout or install, never a stale copy.

Measured on this 2-core box under load: creating the overlay took 42 s, downloads of
temporalio, pyarrow, botocore and fonttools included (≈ 93 MB); a ready overlay is
found in milliseconds (the marker file). Installing torch and transformers into the
project's own environment instead would add a ≈ 190 MB torch wheel to every install.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from pydantic import BaseModel

from environments.cache import default_cache_dir
from environments.vllm_cpu import (
    VllmVenvError,
    ensure_vllm_venv,
    venv_environment,
    venv_python,
)

#: What the trainer needs beyond the vLLM venv (torch, transformers, pydantic, httpx).
TRAINER_REQUIREMENTS = ("temporalio==1.35.0", "pyarrow>=15", "matplotlib>=3.8", "boto3>=1.34")
MARKER_NAME = ".rollout-trainer-ready.json"
TRAINER_PACKAGES = (
    "schemas",
    "rollout_client",
    "task_formats",
    "bridges",
    "trainer",
    "gateway/engines",
)
"""Package directories the trainer imports; a nested one comes with only its parents'
``__init__.py``."""


NO_DEPS = "--no-deps "
"""An extra starting with this is installed without its dependencies, after the others:
for a trainer whose declared pins contradict the vLLM venv's, with the dependencies it
really imports listed as extras of their own."""

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
"""Where the trainers' pins live: one optional-dependency extra per trainer."""


def trainer_extras(pyproject: Path = PYPROJECT) -> dict[str, tuple[str, ...]]:
    """Per trainer, what its overlay adds (pip requirements): its extra in `pyproject`,
    each package named in `[tool.rollout.trainer-envs] no-deps` marked with
    :data:`NO_DEPS`; `reference` (our own trainer) adds nothing. Each distinct tuple is
    its own overlay, so a trainer framework's pins never move another trainer's packages."""
    data = tomllib.loads(pyproject.read_text())
    extras = data["project"]["optional-dependencies"]
    table = data["tool"]["rollout"]["trainer-envs"]
    bare = set(table["no-deps"])
    out: dict[str, tuple[str, ...]] = {"reference": ()}
    for trainer in table["trainers"]:
        if trainer not in extras:
            raise ValueError(
                f"{pyproject}: [tool.rollout.trainer-envs] trainers: {trainer!r} has no "
                "[project.optional-dependencies] extra"
            )
        out[trainer] = tuple(
            f"{NO_DEPS}{req}" if _REQ_NAME.split(req, 1)[0] in bare else req
            for req in extras[trainer]
        )
    return out


_REQ_NAME = re.compile(r"[^A-Za-z0-9._-]")
"""Where a requirement's project name ends (`verl==0.9.1` → `verl`)."""

TRAINER_EXTRAS = trainer_extras()
"""The trainers' overlays, read once from pyproject.toml (:func:`trainer_extras`)."""


class TrainerEnvMarker(BaseModel):
    """Written last; its absence means "build again"."""

    requirements: list[str]
    base_venv: str
    install_s: float


def _key(base: Path, extras: tuple[str, ...]) -> str:
    digest = hashlib.sha256(json.dumps([str(base), *TRAINER_REQUIREMENTS, *extras]).encode())
    return digest.hexdigest()[:12]


def trainer_env_dir(
    cache_dir: Path | None = None, base: Path | None = None, extras: tuple[str, ...] = ()
) -> Path:
    base = base or ensure_vllm_venv(cache_dir)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return root / f"trainer-env-{_key(base, tuple(extras))}"


def trainer_env_install_log(env_dir: Path) -> Path:
    """Where :func:`ensure_trainer_env` writes the output of its installers."""
    return env_dir.parent / f"{env_dir.name}-install.log"


def trainer_env_ready(env_dir: Path) -> bool:
    return (env_dir / MARKER_NAME).exists()


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=venv_environment(),
    )
    return Path(out.stdout.strip())


def _run(cmd: list[str], log: Path, what: str) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        code = subprocess.run(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=venv_environment(),
        ).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise VllmVenvError(f"trainer env: {what} failed (exit {code}); log {log}\n{tail}")


def ensure_trainer_env(cache_dir: Path | None = None, extras: tuple[str, ...] = ()) -> Path:
    """The trainer overlay venv with `extras` too (created on first use); returns its
    directory."""
    extras = tuple(extras)
    base = ensure_vllm_venv(cache_dir)
    env_dir = trainer_env_dir(cache_dir, base, extras)
    marker = env_dir / MARKER_NAME
    if marker.exists():
        return env_dir
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with (env_dir.parent / f".{env_dir.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return env_dir
        started = time.monotonic()
        log = trainer_env_install_log(env_dir)
        base_python = venv_python(base)
        base_exe = subprocess.run(
            [str(base_python), "-c", "import sys; print(sys._base_executable)"],
            capture_output=True,
            text=True,
            check=True,
            env=venv_environment(),
        ).stdout.strip()
        python = venv_python(env_dir)
        if not python.exists():
            _run([base_exe, "-m", "venv", str(env_dir)], log, "creating the venv")
        (_site_packages(python) / "rollout-vllm-base.pth").write_text(
            f"{_site_packages(base_python)}\n"
        )
        freeze = subprocess.run(
            [str(base_python), "-m", "pip", "freeze", "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            check=True,
            env=venv_environment(),
        ).stdout
        constraints = env_dir / "vllm-constraints.txt"
        constraints.write_text(
            "\n".join(ln for ln in freeze.splitlines() if "==" in ln and " @ " not in ln) + "\n"
        )
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        requirements = [*TRAINER_REQUIREMENTS, *extras]
        plain = [r for r in requirements if not r.startswith(NO_DEPS)]
        bare = [r.removeprefix(NO_DEPS) for r in requirements if r.startswith(NO_DEPS)]
        _run([*pip, "install", "-c", str(constraints), *plain], log, "pip install")
        if bare:
            _run([*pip, "install", "--no-deps", *bare], log, "pip install --no-deps")
        probe = "import torch, transformers, temporalio, pyarrow, matplotlib, pydantic, httpx"
        _run([str(python), "-c", probe], log, "import check")
        info = TrainerEnvMarker(
            requirements=requirements,
            base_venv=str(base),
            install_s=round(time.monotonic() - started, 1),
        )
        marker.write_text(info.model_dump_json(indent=2) + "\n")
    return env_dir


def trainer_python(cache_dir: Path | None = None, extras: tuple[str, ...] = ()) -> Path:
    return venv_python(ensure_trainer_env(cache_dir, extras))


def trainer_pythonpath(root: Path, link_dir: Path | None = None) -> Path:
    """A directory holding links to the ``TRAINER_PACKAGES`` only.

    ``root`` is the directory holding those packages (the caller knows where its
    ``schemas`` lives; devstack imports no product package). ``link_dir`` is (re)made
    in place — `rollout train` keeps it inside OUT, so a killed launcher leaves nothing
    behind elsewhere; None makes a temporary directory the caller removes.
    """
    if link_dir is None:
        link_dir = Path(tempfile.mkdtemp(prefix="rollout-trainer-path-"))
    else:
        shutil.rmtree(link_dir, ignore_errors=True)
        link_dir.mkdir(parents=True)
    for name in TRAINER_PACKAGES:
        target = root / name
        if not target.is_dir():
            raise FileNotFoundError(f"package {name!r} not found under {root}")
        *parents, _ = Path(name).parts
        for depth in range(1, len(parents) + 1):  # `gateway/` with its __init__.py only
            parent = Path(*parents[:depth])
            if not (link_dir / parent).is_dir():
                (link_dir / parent).mkdir()
                (link_dir / parent / "__init__.py").symlink_to(root / parent / "__init__.py")
        (link_dir / name).symlink_to(target, target_is_directory=True)
    return link_dir


def trainer_environment(pythonpath: Path) -> dict[str, str]:
    """The environment the trainer process runs with (offline HF, our trainer packages)."""
    env = venv_environment()
    env.update(
        PYTHONPATH=str(pythonpath),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
    )
    return env


if __name__ == "__main__":
    print(ensure_trainer_env())
    sys.exit(0)
