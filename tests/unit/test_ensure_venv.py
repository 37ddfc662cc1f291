"""scripts/ensure_venv.sh --check: a .venv made for another location is told apart.

Each case is a real venv (``python -m venv --without-pip``, seconds) in a checkout-shaped
temp directory, damaged the way a moved or copied checkout damages it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure_venv.sh"


def check(venv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "--check", str(venv)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    v = checkout / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True)
    # what pip writes: a script whose shebang is this venv's interpreter
    (v / "bin" / "pip").write_text(f"#!{v / 'bin' / 'python'}\nprint('pip')\n")
    return v


def test_a_venv_made_here_is_kept(venv: Path) -> None:
    r = check(venv)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_script_shebang_of_another_location_is_stale(venv: Path) -> None:
    (venv / "bin" / "rollout").write_text("#!/old/checkout/.venv/bin/python\n")
    r = check(venv)
    assert r.returncode == 1
    assert "/old/checkout/.venv/bin/python" in r.stdout and "rollout" in r.stdout


def test_an_editable_install_of_another_checkout_is_stale(venv: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-checkout"
    (other / "workers").mkdir(parents=True)
    (other / "workers" / "__init__.py").write_text("")
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_editable_elsewhere.pth").write_text(f"{other}\n")
    r = check(venv)
    assert r.returncode == 1
    assert f"points at {other / 'workers'}" in r.stdout


def test_an_interpreter_that_does_not_run_is_stale(venv: Path) -> None:
    python = venv / "bin" / "python"
    python.unlink()
    python.symlink_to("/nonexistent/python3")
    r = check(venv)
    assert r.returncode == 1 and "does not run" in r.stdout


def test_no_venv_at_all_is_reported(tmp_path: Path) -> None:
    r = check(tmp_path / ".venv")
    assert r.returncode == 1 and "no " in r.stdout
