"""Reproducible sandbox base image: debootstrap → `docker import` → `docker build`.

Why this shape: no Docker Hub here, so the base layer is bootstrapped from the same
Debian mirror apt uses on this machine, imported as a local image, and the agent layer
is a normal `docker build` FROM it. The image is tagged with the hash of every recipe
input (suite, mirror, Dockerfile, pinned versions, build CA bundle), so a rerun on the
same machine is a no-op and a fresh machine rebuilds the same recipe. The local
(bubblewrap) backend uses the same image exported to a directory, so agents see the
same system under both backends.

CLI: ``python -m sandboxes.image.base_image build [--no-rootfs] [--force] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from sandboxes.host.commands import dies_with_this_thread
from schemas.agent_versions import BUILD_ARGS

RECIPE_DIR = Path(__file__).parent
IMAGE_REPO = "agentic-rollout/sandbox-base"
DEBIAN_REPO = "agentic-rollout/debian"
HASH_LABEL = "agentic-rollout.recipe-hash"
SUITE = "bookworm"
DEBOOTSTRAP_VARIANT = "minbase"
DEBOOTSTRAP_INCLUDE = ("ca-certificates",)
#: The Dockerfile's version build args: Node (the image's own pin) and the agents'
#: (`schemas.agent_versions`). A bump is a new recipe hash, so a rebuild.
VERSIONS: dict[str, str] = {"NODE_VERSION": "22.22.0", **BUILD_ARGS}
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class BaseImage(BaseModel):
    tag: str
    image_id: str
    recipe_hash: str
    cached: bool
    build_seconds: float
    rootfs: str | None = None
    rootfs_seconds: float = 0.0


def cache_dir() -> Path:
    """Where exported rootfs trees, task image build logs and the build locks live:
    `$ROLLOUT_SANDBOX_CACHE_DIR`, else a system cache as root (shared by the host's
    workers), else the user's `~/.cache/agentic-rollout`."""
    env = os.environ.get("ROLLOUT_SANDBOX_CACHE_DIR")
    if env:
        p = Path(env)
    elif os.geteuid() == 0:
        p = Path("/var/cache/agentic-rollout")
    else:
        p = Path.home() / ".cache" / "agentic-rollout"
    p.mkdir(parents=True, exist_ok=True)
    return p


def find_debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive URI apt on this machine uses (so debootstrap reaches it too)."""
    candidates: list[str] = []
    files = [apt_dir / "sources.list"]
    d = apt_dir / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                if "deb" not in fields.get("types", "").split():
                    continue
                candidates += [u for u in fields.get("uris", "").split() if u]
        else:
            for line in text.splitlines():
                parts = line.split("#", 1)[0].split()
                if len(parts) >= 3 and parts[0] == "deb":
                    uri = parts[2] if parts[1].startswith("[") else parts[1]
                    candidates.append(uri)
    for uri in candidates:
        u = uri.rstrip("/")
        if u.endswith("/debian") and "security" not in u:
            return u
    raise RuntimeError(
        f"no Debian archive mirror found in {apt_dir}/sources.list(.d); "
        "add one (e.g. 'deb http://deb.debian.org/debian bookworm main')"
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def debian_inputs(mirror: str) -> dict[str, str]:
    return {
        "suite": SUITE,
        "mirror": mirror,
        "variant": DEBOOTSTRAP_VARIANT,
        "include": ",".join(DEBOOTSTRAP_INCLUDE),
        "arch": os.uname().machine,
    }


def recipe_inputs(mirror: str) -> dict[str, str]:
    """Everything that determines the image; its hash is the cache key."""
    inputs = dict(debian_inputs(mirror))
    inputs["dockerfile"] = _sha((RECIPE_DIR / "Dockerfile").read_bytes())
    inputs["host_ca"] = _sha(HOST_CA_BUNDLE.read_bytes()) if HOST_CA_BUNDLE.exists() else ""
    inputs.update(VERSIONS)
    return inputs


def _hash(d: dict[str, str]) -> str:
    return _sha(json.dumps(d, sort_keys=True).encode())[:16]


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def _image_id(ref: str) -> str | None:
    r = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def _check_docker() -> None:
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "info"], capture_output=True).returncode
    ):
        raise RuntimeError(
            "docker engine not reachable; run scripts/install_system_deps.sh "
            "(apt-get install docker.io and start dockerd)"
        )


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    with open(cache_dir() / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ensure_debian(mirror: str) -> str:
    tag = f"{DEBIAN_REPO}:{SUITE}-{_hash(debian_inputs(mirror))}"
    if _image_id(tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap missing; run scripts/install_system_deps.sh")
    with tempfile.TemporaryDirectory(prefix="debootstrap-", dir=cache_dir()) as tmp:
        root = Path(tmp) / "root"
        _run(
            [
                "debootstrap",
                f"--variant={DEBOOTSTRAP_VARIANT}",
                f"--include={','.join(DEBOOTSTRAP_INCLUDE)}",
                "--components=main",
                SUITE,
                str(root),
                mirror,
            ],
            stdout=subprocess.DEVNULL,
        )
        # Same mirror inside the image; drop caches so the layer is smaller.
        (root / "etc/apt/sources.list").write_text(
            f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\n"
        )
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
        )
        _run(
            [
                "docker",
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                'CMD ["/bin/bash"]',
                "-",
                tag,
            ],
            stdin=tar.stdout,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait():
            raise RuntimeError("tar of the debootstrap rootfs failed")
    return tag


def ensure_base_image(force: bool = False) -> BaseImage:
    """Build the base image unless an image with the same recipe hash exists."""
    _check_docker()
    mirror = find_debian_mirror()
    rhash = _hash(recipe_inputs(mirror))
    tag = f"{IMAGE_REPO}:{rhash}"
    t0 = time.monotonic()
    with _lock("image-build"):
        iid = None if force else _image_id(tag)
        if iid:
            _run(["docker", "tag", tag, f"{IMAGE_REPO}:latest"])
            return BaseImage(
                tag=tag, image_id=iid, recipe_hash=rhash, cached=True, build_seconds=0.0
            )
        debian = _ensure_debian(mirror)
        with tempfile.TemporaryDirectory(prefix="image-ctx-") as ctx:
            shutil.copy(RECIPE_DIR / "Dockerfile", Path(ctx) / "Dockerfile")
            ca = Path(ctx) / "host-ca.crt"
            if HOST_CA_BUNDLE.exists():
                shutil.copy(HOST_CA_BUNDLE, ca)
            else:
                ca.write_text("")
            cmd = ["docker", "build", "--network", "host", "-t", tag, "-t", f"{IMAGE_REPO}:latest"]
            cmd += ["--label", f"{HASH_LABEL}={rhash}", "--build-arg", f"BASE_IMAGE={debian}"]
            for k, v in VERSIONS.items():
                cmd += ["--build-arg", f"{k}={v}"]
            _run([*cmd, ctx], env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdout=sys.stderr)
        iid = _image_id(tag)
        assert iid
    return BaseImage(
        tag=tag,
        image_id=iid,
        recipe_hash=rhash,
        cached=False,
        build_seconds=round(time.monotonic() - t0, 1),
    )


def rootfs_dir_for(image_id: str) -> Path:
    return cache_dir() / "rootfs" / image_id.replace("sha256:", "")[:24]


def ensure_rootfs(image_ref: str) -> Path:
    """Export the image's filesystem to a directory (once per image id) for bubblewrap."""
    _check_docker()
    iid = _image_id(image_ref)
    if not iid:
        raise RuntimeError(f"image {image_ref} not found; run scripts/build_base_image.sh")
    dest = rootfs_dir_for(iid)
    ref = rootfs_ref_file(image_ref)
    ref.parent.mkdir(parents=True, exist_ok=True)
    if (dest / ".complete").exists():
        ref.write_text(iid + "\n")
        return dest
    with _lock("rootfs-export"):
        if (dest / ".complete").exists():
            return dest
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        cid = subprocess.run(
            ["docker", "create", iid], check=True, capture_output=True, text=True
        ).stdout.strip()
        try:
            tied = dies_with_this_thread()  # a killed worker's export stops too
            exp = subprocess.Popen(
                ["docker", "export", cid], stdout=subprocess.PIPE, preexec_fn=tied
            )
            subprocess.run(
                ["tar", "--numeric-owner", "-x", "-C", str(tmp)],
                stdin=exp.stdout,
                check=True,
                preexec_fn=tied,
            )
            if exp.wait():
                raise RuntimeError("docker export failed")
        finally:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
        (tmp / ".complete").write_text(iid + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        ref.write_text(iid + "\n")
    return dest


def rootfs_ref_file(image_ref: str) -> Path:
    """Pointer file: image ref → id of its exported rootfs (lets the local backend
    find the rootfs without asking docker)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", image_ref)
    return cache_dir() / "rootfs" / "refs" / safe


def rootfs_image_id(rootfs: Path) -> str | None:
    """Image id a rootfs directory was exported from (its env_version)."""
    marker = rootfs / ".complete"
    return marker.read_text().strip() if marker.exists() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["build", "hash", "mirror"])
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--no-rootfs", action="store_true", help="skip the rootfs export")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.command == "mirror":
        print(find_debian_mirror())
        return 0
    if a.command == "hash":
        print(_hash(recipe_inputs(find_debian_mirror())))
        return 0
    img = ensure_base_image(force=a.force)
    if not a.no_rootfs:
        t0 = time.monotonic()
        img.rootfs = str(ensure_rootfs(img.tag))
        ensure_rootfs(f"{IMAGE_REPO}:latest")
        img.rootfs_seconds = round(time.monotonic() - t0, 1)
    if a.json:
        print(img.model_dump_json())
    else:
        state = "cached" if img.cached else f"built in {img.build_seconds}s"
        print(f"{img.tag} {img.image_id} ({state}); rootfs: {img.rootfs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
