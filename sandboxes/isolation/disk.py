"""A sandbox's writable area as one sized filesystem: how ``disk_mb`` is enforced.

Why a loop-mounted ext4 image and not the alternatives, on the hosts we run on:
* RLIMIT_FSIZE caps one file, not the total (many small files fill the host);
* tmpfs pages are RAM charged to the sandbox's memory cgroup: a 4 GiB disk under a
  2 GiB memory cap is never reachable, and every byte written is a byte of RAM;
* project quotas need a filesystem mounted with ``prjquota`` (the state dir's ext4
  is not) and docker's ``storage_opt`` needs overlay2 on xfs with ``pquota``.
A sparse image file formatted as ext4 and loop-mounted under the sandbox's state dir
is a hard, shared limit over workdir, home and /tmp (writes past it fail with
ENOSPC), uses real disk only as it fills, and costs a few tens of ms at create (a
warm pool takes it off the acquire path). It needs root (loop devices, mount), so a
non-root worker asked for ``disk_mb`` refuses the provision (`DiskLimitUnavailable`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from sandboxes.base import SandboxError

#: Mount point (inside the state dir) and backing image of a sandbox's sized disk.
DISK_DIR = "disk"
DISK_IMAGE = "disk.img"
#: The writable dirs a sandbox gets on its disk.
DISK_SUBDIRS = ("tmp", "home", "work")


class DiskLimitUnavailable(SandboxError):
    """This host cannot enforce ``disk_mb``: the provision fails instead of running
    with a weaker limit (set ``disk_mb`` to null to run without one)."""


def disk_limit_problem() -> str | None:
    """Why a sized disk cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "it needs root (loop devices and mount)"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install e2fsprogs mount)"
    if not Path("/dev/loop-control").exists():
        return "/dev/loop-control is missing (no loop devices on this host)"
    return None


def make_disk(state_dir: Path, size_mb: int, owner_uid: int | None = None) -> Path:
    """Create, format and mount a `size_mb` disk at ``state_dir/disk``; its subdirs
    (`DISK_SUBDIRS`) are owned by `owner_uid`. Returns the mount point."""
    problem = disk_limit_problem()
    if problem:
        raise DiskLimitUnavailable(
            f"resources.disk_mb={size_mb} cannot be enforced on this host: {problem}; "
            "run the worker as root or set disk_mb to null (no disk limit)"
        )
    img, mnt = state_dir / DISK_IMAGE, state_dir / DISK_DIR
    with open(img, "wb") as f:
        f.truncate(size_mb * 1024 * 1024)  # sparse: disk is used only as it fills
    mnt.mkdir()
    # No journal and no reserved blocks: the whole size is the agent's, and the
    # inode tables are never zeroed in the background (noinit_itable).
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E",
          "lazy_itable_init=1,nodiscard", str(img)])  # fmt: skip
    _run(["mount", "-o", "loop,noinit_itable,nosuid,nodev", str(img), str(mnt)])
    for sub in DISK_SUBDIRS:
        (mnt / sub).mkdir()
        if owner_uid is not None:
            os.chown(mnt / sub, owner_uid, owner_uid)
    with contextlib.suppress(FileNotFoundError):
        (mnt / "lost+found").rmdir()
    return mnt


def release_disk(state_dir: Path) -> None:
    """Unmount and delete a sandbox's disk (idempotent); its processes must be gone.

    A mount still busy (a process that escaped the kill) is detached lazily so the
    state dir can go; the loop device is freed when the last user exits.
    """
    mnt = state_dir / DISK_DIR
    if os.path.ismount(mnt):
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
        if r.returncode and os.path.ismount(mnt):
            _run(["umount", "-l", str(mnt)])
    with contextlib.suppress(FileNotFoundError):
        (state_dir / DISK_IMAGE).unlink()


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SandboxError(f"{cmd[0]} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
