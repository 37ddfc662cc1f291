"""What restoring the test runner's config costs the `swebench` check's test placement.

Usage: python -m bench.runner_restore [--config-files 200] [--files 5000] [--rounds 10]
                                      [--backend local|docker]

A generated git repository with `--config-files` runner config files (conftest.py,
setup.cfg, tox.ini, pyproject.toml, pytest.ini spread over directories) among `--files`
ordinary ones is copied into a real sandbox. Each round, an agent step (not timed)
rewrites every tracked config file and plants as many untracked ones in an ignored
directory; then the check's test placement runs as an evaluation step, once with the
restore (what the check runs) and once without it (placement of the patch's files only),
in alternating order. Prints p50/max of both, the added milliseconds and the ratio, and
checks after each restore that the tree's config is the base commit's again.
Needs the base image (scripts/build_base_image.sh) and bwrap/docker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from hooks.swebench_check import PLACE_TESTS, PLACE_TESTS_ONLY
from sandboxes.base import Sandbox, SandboxSpec
from schemas.workspace import RepoSpec

REPO = "/workspace/repo"
_TEST = "def test_a():\n    pass\n"
_CONFIG_NAMES = ("conftest.py", "setup.cfg", "tox.ini", "pyproject.toml", "pytest.ini")
#: The agent step: every tracked config file changed, the same number planted untracked.
_DIRTY = r"""
cd "$1" && git ls-files -z -- '*conftest.py' '*setup.cfg' '*tox.ini' '*pyproject.toml' \
  '*pytest.ini' | xargs -0 -n 50 sh -c 'for f; do echo "# agent" >> "$f"; done' sh
i=0; for f in $(git ls-files -- '*conftest.py' '*setup.cfg' '*tox.ini' '*pyproject.toml' \
  '*pytest.ini'); do mkdir -p "build/$i" && echo x > "build/$i/${f##*/}"; i=$((i+1)); done
"""
#: Prints how many config files differ from the base commit (the patched one aside) or
#: are planted.
_LEFT = r"""
cd "$1" && { git diff --name-only | grep -v -e '^tests/d0/conftest.py$' -e '^tests/test_0.py$'
  find build -type f 2>/dev/null; } | wc -l
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_repo(root: Path, config_files: int, files: int) -> tuple[Path, str, str]:
    """(the repo, its base commit, a test patch changing one test file and one conftest)."""
    repo = root / "repo"
    dirs = max(1, config_files // len(_CONFIG_NAMES))
    for i in range(files):
        d = repo / "pkg" / f"m{i % 100}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text(f"VALUE = {i}\n")
    for i in range(config_files):
        d = repo / "tests" / f"d{i % dirs}"
        d.mkdir(parents=True, exist_ok=True)
        (d / _CONFIG_NAMES[i // dirs % len(_CONFIG_NAMES)]).write_text(f"# config {i}\n")
    (repo / "tests" / "test_0.py").write_text(_TEST)
    (repo / ".gitignore").write_text("build/\n")
    _git(repo.parent, "init", "-q", "-b", "main", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=b", "-c", "user.email=b@b.invalid", "commit", "-qm", "base")
    (repo / "tests" / "test_0.py").write_text(_TEST + "\n\ndef test_b():\n    pass\n")
    (repo / "tests" / "d0" / "conftest.py").write_text("# patched\n")
    patch = _git(repo, "diff") + "\n"
    _git(repo, "checkout", "--", ".")
    return repo, _git(repo, "rev-parse", "HEAD"), patch


async def _place(sandbox: Sandbox, script: str, base: str, patch: str) -> float:
    t0 = time.perf_counter()
    res = await sandbox.evaluator_exec(
        ["/bin/sh", "-c", script, "bench", REPO, base, "write"],
        cwd=REPO,
        timeout=600,
        stdin=patch.encode(),
    )
    took = time.perf_counter() - t0
    if res.exit_code != 0:
        raise RuntimeError(f"placement failed (exit {res.exit_code}): {res.stdout}{res.stderr}")
    return took


async def _sh(sandbox: Sandbox, script: str) -> str:
    res = await sandbox.exec(["/bin/sh", "-c", script, "sh", REPO], timeout=600)
    if res.exit_code != 0:
        raise RuntimeError(f"{script!r} failed: {res.stderr}")
    return res.stdout.strip()


def _ms(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs) * 1000, 1), "max_ms": round(max(xs) * 1000, 1)}


async def run(backend_name: str, config_files: int, files: int, rounds: int) -> dict[str, Any]:
    from sandboxes.registry import get_backend

    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        Path(tmp).chmod(0o755)  # the local backend's sandbox uid reaches its state dir
        repo, base, patch = make_repo(Path(tmp), config_files, files)
        backend: Any = get_backend(backend_name, state_dir=Path(tmp) / "state")
        spec = SandboxSpec(
            rollout_id=f"bench-{uuid.uuid4().hex[:10]}",
            repo=RepoSpec(url=str(repo), commit=base, path=REPO),
        )
        sandbox = await backend.create(spec)
        times: dict[str, list[float]] = {"restore": [], "no_restore": []}
        try:
            await _place(sandbox, PLACE_TESTS, base, patch)  # warm-up, not timed
            for i in range(rounds):
                order = ("restore", "no_restore") if i % 2 == 0 else ("no_restore", "restore")
                for mode in order:
                    await _sh(sandbox, _DIRTY)
                    script = PLACE_TESTS if mode == "restore" else PLACE_TESTS_ONLY
                    times[mode].append(await _place(sandbox, script, base, patch))
                    left = int(await _sh(sandbox, _LEFT))
                    if (left == 0) != (mode == "restore"):
                        raise RuntimeError(f"{mode}: {left} config files left changed")
        finally:
            await sandbox.destroy()
            await backend.close()
    with_restore, without = _ms(times["restore"]), _ms(times["no_restore"])
    return {
        "backend": backend_name,
        "files": files + config_files,
        "config_files": config_files,
        "rounds": rounds,
        "restore": with_restore,
        "no_restore": without,
        "added_p50_ms": round(with_restore["p50_ms"] - without["p50_ms"], 1),
        "ratio_p50": round(with_restore["p50_ms"] / without["p50_ms"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config-files", type=int, default=200)
    ap.add_argument("--files", type=int, default=5000, help="ordinary files beside them")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--backend", default="local", choices=("local", "docker"))
    args = ap.parse_args()
    out = asyncio.run(run(args.backend, args.config_files, args.files, args.rounds))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
