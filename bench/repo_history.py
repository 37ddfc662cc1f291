"""What cutting a task repo's history to its base commit costs at provision.

Usage: python -m bench.repo_history [--commits 10000] [--files 5000] [--later 1000]
                                    [--runs 5] [--backends local,docker]

The bench generates a repository (`git fast-import`): `--files` files in its first
commit, then `--commits` commits in all, each changing two files, with tags along the
way; the base commit is `--later` commits before the tip (`main` and HEAD there, the
tip on another branch, as in SWE-bench's images). Then, in one run, alternating:

* a cloned repo (`sandbox.repo`, on each of `--backends`): the checkout as provisioning
  made it before (a clone of the host's whole mirror) vs a fresh repository with the
  base commit's objects alone (`repo_trim.checkout_commit`), both through the backend's
  real `create`;
* a repo in the image (docker; SWE-bench's layout, /testbed root's with mode 777): a
  create that leaves it as the image has it vs one that cuts it in the sandbox
  (`SandboxSpec.image_repos`).

Reported per mode: provision (create) time p50, the repo's disk in the sandbox (`du`
of the checkout, of its `.git`; for the image repo the container's writable layer),
and for a cloned repo the host's temporary checkout and the tar held in memory. The
mirror is made before timing (both modes share it). Needs git on the host, bubblewrap
and/or docker, and the base image (scripts/build_base_image.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandboxes.base import ImageRepo, RepoSpec, ResourceLimits, SandboxSpec
from sandboxes.host.state import state_root
from sandboxes.workspace import provisioning
from sandboxes.workspace.repo_trim import checkout_commit, git

#: No sized disk: the repo's own cost is measured, not the disk's (see sandbox_acquire).
RESOURCES = ResourceLimits(disk_mb=None)
SANDBOX_REPO = "/workspace/repo"


def generate_repo(path: Path, commits: int, files: int, later: int) -> str:
    """The bench's repository at `path`; returns its base commit (`later` before tip)."""
    rnd = random.Random(0)
    names = [f"src/pkg{i // 100:03d}/mod{i:05d}.py" for i in range(files)]
    content = {n: [f"# {n}\n", f"VALUE = {i}\n"] for i, n in enumerate(names)}
    out = io.BytesIO()

    def data(text: str) -> None:
        raw = text.encode()
        out.write(b"data %d\n" % len(raw) + raw + b"\n")

    for c in range(1, commits + 1):
        out.write(b"commit refs/heads/main\nmark :%d\n" % c)
        out.write(b"committer Bench <bench@example.invalid> %d +0000\n" % (1_600_000_000 + c))
        data(f"commit {c}\n")
        changed = names if c == 1 else rnd.sample(names, 2)
        for n in changed:
            if c > 1:
                content[n].append(f"def f{c}():\n    return {c}\n")
            out.write(f"M 100644 inline {n}\n".encode())
            data("".join(content[n]))
        if c % 1000 == 0:
            out.write(b"reset refs/tags/v%d\nfrom :%d\n\n" % (c // 1000, c))
    path.mkdir(parents=True)
    git("init", "--quiet", "-b", "main", str(path))
    marks = path / ".git" / "bench-marks"
    subprocess.run(
        ["git", "fast-import", "--quiet", f"--export-marks={marks}"],
        cwd=path,
        input=out.getvalue(),
        check=True,
    )
    git("repack", "-a", "-d", "-q", cwd=path)
    mark = dict(line.split() for line in marks.read_text().splitlines())
    marks.unlink()
    base = mark[f":{commits - later}"]
    # SWE-bench's layout: main reset to the base commit, the later work on a branch.
    git("branch", "upstream", "main", cwd=path)
    git("reset", "--quiet", "--hard", base, cwd=path)
    return base


def clone_checkout(mirror: Path, commit: str, work: Path) -> None:
    """The checkout as provisioning made it before: a clone of the whole mirror."""
    git("clone", "--quiet", "--no-checkout", "--no-hardlinks", str(mirror), str(work))
    git("checkout", "--quiet", "--detach", commit, cwd=work)


def du_kib(path: Path) -> int:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


async def sandbox_du(sb: Any, *paths: str) -> list[int]:
    """KiB under each path (one `du` each: one `du` counts a nested path once)."""
    out = []
    for path in paths:
        r = await sb.exec(["du", "-sk", path], timeout=120)
        assert r.exit_code == 0, r.stderr
        out.append(int(r.stdout.split()[0]))
    return out


async def objects_in(sb: Any, path: str) -> int:
    script = "git -c safe.directory='*' cat-file --batch-all-objects --batch-check | wc -l"
    r = await sb.exec(["/bin/sh", "-c", script], cwd=path, timeout=120)
    assert r.exit_code == 0, r.stderr
    return int(r.stdout)


CHECKOUTS: dict[str, Callable[[Path, str, Path], None]] = {
    "clone (before)": clone_checkout,
    "trimmed": checkout_commit,
}


async def bench_cloned(backend: Any, url: str, base: str, runs: int) -> dict[str, Any]:
    """Alternating creates of a sandbox with the repo checked out either way: the
    checkout `provisioning.repo_tar` runs is swapped per mode, and repo_tar is timed."""
    mirror = provisioning._mirror(url, base, state_root("git-cache"))
    real_checkout, real_repo_tar = provisioning.checkout_commit, provisioning.repo_tar
    out: dict[str, Any] = {}
    now = {"mode": ""}

    def timed_repo_tar(url: str, commit: str, cache: Path | None = None) -> bytes:
        t = time.perf_counter()
        data = real_repo_tar(url, commit, cache)
        out[now["mode"]]["repo_tar_s"].append(time.perf_counter() - t)
        return data

    try:
        for mode, checkout in CHECKOUTS.items():  # host side, once: temp checkout and tar
            provisioning.checkout_commit = checkout
            with tempfile.TemporaryDirectory(prefix="bench-repo-") as tmp:
                checkout(mirror, base, Path(tmp) / "repo")
                host_kib = du_kib(Path(tmp) / "repo")
            tar = await asyncio.to_thread(real_repo_tar, url, base)
            out[mode] = {"host_checkout_kib": host_kib, "tar_kib": len(tar) // 1024,
                         "create_s": [], "repo_tar_s": []}  # fmt: skip
        provisioning.repo_tar = timed_repo_tar  # what populate calls
        for _ in range(runs):
            for mode, checkout in CHECKOUTS.items():
                provisioning.checkout_commit, now["mode"] = checkout, mode
                spec = SandboxSpec(
                    rollout_id=f"bench-{uuid.uuid4().hex[:10]}",
                    resources=RESOURCES,
                    repo=RepoSpec(url=url, commit=base, path=SANDBOX_REPO),
                )
                t0 = time.perf_counter()
                sb = await backend.create(spec)
                out[mode]["create_s"].append(time.perf_counter() - t0)
                repo_kib, git_kib = await sandbox_du(sb, SANDBOX_REPO, f"{SANDBOX_REPO}/.git")
                out[mode].update(
                    sandbox_repo_kib=repo_kib,
                    sandbox_git_kib=git_kib,
                    objects=await objects_in(sb, SANDBOX_REPO),
                )
                await sb.destroy()
    finally:
        provisioning.checkout_commit, provisioning.repo_tar = real_checkout, real_repo_tar
    return out


def build_image(base_image: str, repo: Path, tmp: Path) -> str:
    """The base image with `repo` at /testbed, root's and mode 777 (SWE-bench's layout)."""
    ctx = tmp / "image-ctx"
    ctx.mkdir()
    shutil.copytree(repo, ctx / "testbed", symlinks=True)
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\nUSER root\nCOPY testbed /testbed\nRUN chmod -R a+rwX /testbed\n"
        "USER 1000:1000\n"
    )
    tag = f"agentic-rollout-bench/repo-history:{uuid.uuid4().hex[:10]}"
    subprocess.run(
        ["docker", "build", "--network", "none", "-q", "-t", tag, str(ctx)],
        check=True,
        capture_output=True,
    )
    return tag


def container_rw_bytes(container_id: str) -> int:
    """What the container wrote on the host: its writable layer's size."""
    r = subprocess.run(
        ["docker", "container", "inspect", "--size", "--format", "{{.SizeRw}}", container_id],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(r.stdout.strip() or 0)


async def bench_image(backend: Any, image: str, base: str, runs: int) -> dict[str, Any]:
    """Alternating creates of a sandbox of the image, its repo left as is or cut."""
    modes = {"as in the image (before)": [], "trimmed": [ImageRepo(path="/testbed", commit=base)]}
    out: dict[str, Any] = {m: {"create_s": []} for m in modes}
    for _ in range(runs):
        for mode, repos in modes.items():
            spec = SandboxSpec(
                rollout_id=f"bench-{uuid.uuid4().hex[:10]}",
                image=image,
                workdir="/testbed",
                resources=RESOURCES,
                image_repos=repos,
            )
            t0 = time.perf_counter()
            sb = await backend.create(spec)
            out[mode]["create_s"].append(time.perf_counter() - t0)
            size_rw = await asyncio.to_thread(container_rw_bytes, sb.handle.details["container_id"])
            (git_kib,) = await sandbox_du(sb, "/testbed/.git")
            out[mode].update(
                container_rw_kib=size_rw // 1024,
                sandbox_git_kib=git_kib,
                objects=await objects_in(sb, "/testbed"),
            )
            await sb.destroy()
    return out


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 1)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--files", type=int, default=5_000)
    ap.add_argument("--later", type=int, default=1_000, help="commits after the base commit")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--backends", default="local,docker")
    a = ap.parse_args()
    from sandboxes.registry import get_backend

    tmp = Path(tempfile.mkdtemp(prefix="ar-bench-history-", dir="/tmp"))
    tmp.chmod(0o755)
    os.environ["ROLLOUT_SANDBOX_STATE_DIR"] = str(tmp / "state")  # the mirror goes with it
    results: dict[str, Any] = {}
    image = None
    try:
        t0 = time.perf_counter()
        base = generate_repo(tmp / "src", a.commits, a.files, a.later)
        results["repo"] = {
            "commits": a.commits,
            "files": a.files,
            "later": a.later,
            "kib": du_kib(tmp / "src" / ".git"),
            "generated_s": round(time.perf_counter() - t0, 1),
        }
        for name in a.backends.split(","):
            backend: Any = get_backend(name, state_dir=tmp / "state" / name)
            try:
                warm = await backend.create(
                    SandboxSpec(rollout_id="bench-warm", resources=RESOURCES)
                )
                await warm.destroy()
                results[f"{name} cloned repo"] = await bench_cloned(
                    backend, str(tmp / "src"), base, a.runs
                )
                if name == "docker":
                    image = build_image(backend.image, tmp / "src", tmp)
                    results["docker image repo"] = await bench_image(backend, image, base, a.runs)
            finally:
                for h in await backend.list():
                    await backend.destroy(h)
                await backend.close()
    finally:
        if image:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    for modes in (v for k, v in results.items() if k != "repo"):
        for r in modes.values():
            for key in ("create_s", "repo_tar_s"):
                if key in r:
                    r[key.replace("_s", "_p50_ms")] = p50(r.pop(key))
    print(f"repo: {json.dumps(results.pop('repo'))}")
    for case, modes in results.items():
        for mode, r in modes.items():
            print(f"{case:20} {mode:26} {json.dumps(r)}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
