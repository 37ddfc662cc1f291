"""Limits are real or refused (issue 9, point 11), on real bubblewrap and docker.

* ``disk_mb`` caps everything the agent can write in total (workdir, home, /tmp):
  many files together run into ENOSPC, and no other writable path gets around it;
* the bwrap seccomp filter answers EPERM to syscalls an agent never needs, while
  python, git, node and the shell keep working;
* a cgroup limit that cannot be applied fails the provision; without cgroups the
  local backend refuses to start unless ``allow_no_cgroups`` is set.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import BackendUnavailable, ResourceLimits, SandboxError, SandboxSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

DISK_MB = 64

#: Writes 4 MiB files round-robin into workdir, home and /tmp until a write fails
#: or twice the disk size went out; prints what happened as JSON.
FILL = r"""
import errno, json, os, sys
limit = int(sys.argv[1]) * 2 << 20
dirs = [os.getcwd(), os.path.expanduser("~"), "/tmp"]
chunk = b"x" * (4 << 20)
total, err, i = 0, None, 0
while total < limit:
    p = os.path.join(dirs[i % 3], "fill-%d.bin" % i)
    try:
        with open(p, "wb") as f:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        err = errno.errorcode.get(e.errno)
        break
    total += len(chunk)
    i += 1
print(json.dumps({"written": total, "files": i, "error": err}))
"""

#: Tries writing outside the sized disk: the run dir (a host dir) and /var/tmp.
ESCAPE = r"""
import errno, json
out = {}
for p in ("/run/rollout/fill.bin", "/var/tmp/fill.bin"):
    try:
        open(p, "wb").write(b"x")
        out[p] = "written"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno)
print(json.dumps(out))
"""


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


async def test_disk_mb_is_a_total_limit_that_ends_in_enospc(sandbox_backend: Any) -> None:
    spec = SandboxSpec(rollout_id=rid(), resources=ResourceLimits(disk_mb=DISK_MB))
    sb = await sandbox_backend.create(spec)
    try:
        assert sb.handle.details["disk"] == f"ext4:{DISK_MB}MiB"
        r = await sb.exec(["python3", "-c", FILL, str(DISK_MB)], timeout=300)
        assert r.ok, r
        res = json.loads(r.stdout)
        assert res["error"] == "ENOSPC", res
        assert res["written"] <= DISK_MB << 20, res
        assert res["files"] > 3, res  # many files, each far below the limit
        r = await sb.exec(["python3", "-c", ESCAPE])
        assert json.loads(r.stdout) == {
            "/run/rollout/fill.bin": "EACCES",
            "/var/tmp/fill.bin": "EROFS",
        }, r
        # Full, not broken: freeing space makes writes work again.
        assert (await sb.exec("rm -f fill-*.bin ~/fill-*.bin /tmp/fill-*.bin && echo ok > a")).ok
        assert (await sb.exec(["cat", "a"])).stdout == "ok\n"
    finally:
        await sb.destroy()
    assert not Path(sb.handle.details["state_dir"]).exists()


def _syscall_numbers() -> dict[str, int]:
    import pyseccomp

    arch = pyseccomp.system_arch()
    names = ("keyctl", "add_key", "unshare", "userfaultfd", "personality", "io_uring_setup")
    return {n: pyseccomp.resolve_syscall(arch, n) for n in names}


#: Calls each syscall once through ctypes; prints errno names (or "ok").
PROBE = r"""
import ctypes, errno, json, sys
nr = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
calls = {
    "keyctl": (nr["keyctl"], 0, -3, 1),  # KEYCTL_GET_KEYRING_ID(session, create)
    "add_key": (nr["add_key"], b"user", b"k", b"v", 1, -3),
    "unshare_user": (nr["unshare"], 0x10000000),  # CLONE_NEWUSER
    "userfaultfd": (nr["userfaultfd"], 1),  # UFFD_USER_MODE_ONLY
    "personality_norandom": (nr["personality"], 0x0040000),  # ADDR_NO_RANDOMIZE
    "io_uring_setup": (nr["io_uring_setup"], 1, 0),
    "personality_query": (nr["personality"], 0xFFFFFFFF),
}
out = {}
for name, args in calls.items():
    res = libc.syscall(*args)
    out[name] = "ok" if res >= 0 else errno.errorcode.get(ctypes.get_errno())
print(json.dumps(out))
"""

NORMAL_WORK = "\n".join(
    [
        "set -e",
        "python3 -c 'import subprocess as s, sys; "
        'print(s.run([sys.executable, "-c", "print(6*7)"], capture_output=True).stdout.decode())'
        "' | head -n 1",
        "git init -q repo && cd repo && echo hi > f && git add f",
        "git commit -qm first && git log --format=%s",
        'node -e \'const fs = require("fs"); fs.writeFileSync("n.txt", "node");'
        ' console.log(fs.readFileSync("n.txt", "utf8"))\'',
        "seq 1 5 | sort -r | head -n 2 | tr '\\n' ' '; echo",
        "python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python -c 'print(\"venv\")'",
    ]
)


async def test_bwrap_seccomp_denies_escape_syscalls_and_keeps_agent_work(
    local_backend: Any,
) -> None:
    sb = await local_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        r = await sb.exec(["python3", "-c", PROBE, json.dumps(_syscall_numbers())])
        assert r.ok, r
        assert json.loads(r.stdout) == {
            "keyctl": "EPERM",
            "add_key": "EPERM",
            "unshare_user": "EPERM",
            "userfaultfd": "EPERM",
            "personality_norandom": "EPERM",
            "io_uring_setup": "EPERM",
            "personality_query": "ok",
        }
        r = await sb.exec(["unshare", "-U", "true"])
        assert r.exit_code == 1 and "Operation not permitted" in r.stderr, r
        r = await sb.exec(NORMAL_WORK, timeout=120)
        assert r.ok, r
        assert r.stdout == "42\nfirst\nnode\n5 4 \nvenv\n", r
    finally:
        await sb.destroy()


async def test_a_cgroup_limit_that_cannot_be_applied_fails_the_provision(
    local_backend: Any,
) -> None:
    # The kernel refuses a CFS quota under 1 ms per 100 ms period (EINVAL).
    spec = SandboxSpec(rollout_id=rid(), resources=ResourceLimits(cpus=0.005))
    with pytest.raises(SandboxError, match=r"cannot apply cgroup limit .*cpu\.cfs_quota_us = 500"):
        await local_backend.create(spec)
    assert await local_backend.list() == []  # nothing half-made is left


async def test_without_cgroups_the_local_backend_refuses_unless_allowed(
    sandbox_state_dir: Path,
    sandbox_base_image: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sandboxes.backends.local import LocalBackend

    no_cgroups = tmp_path / "no-cgroup-fs"  # a host where no cgroup hierarchy is mounted
    no_cgroups.mkdir()
    kw: dict[str, Any] = {
        "state_dir": sandbox_state_dir / "local-nocg",
        "rootfs": sandbox_base_image.rootfs,
        "cgroup_root": no_cgroups,
    }
    with pytest.raises(BackendUnavailable, match="allow_no_cgroups"):
        LocalBackend(**kw)
    with caplog.at_level(logging.WARNING, logger="sandboxes.backends.local"):
        b = LocalBackend(**kw, allow_no_cgroups=True)
    assert "WITHOUT CGROUPS" in caplog.text
    sb = await b.create(SandboxSpec(rollout_id=rid()))
    try:
        assert sb.handle.details["limits"] == "rlimit"
        assert (await sb.exec(["true"])).ok
    finally:
        await sb.destroy()
        await b.close()


async def test_docker_limits_are_checked_in_the_containers_cgroups(docker_backend: Any) -> None:
    """The engine may drop a limit with only a warning; the backend reads what is in
    force in the container's cgroups after start (a mismatch fails the provision)."""
    from sandboxes.isolation.cgroups import limit_problems

    res = ResourceLimits(memory_mb=512, pids=256, cpus=0.5)
    sb = await docker_backend.create(SandboxSpec(rollout_id=rid(), resources=res))
    try:
        pid, cid = sb.handle.details["init_pid"], sb.handle.details["container_id"]
        assert limit_problems(pid, cid, 512, 256, 0.5) == []
        assert limit_problems(pid, cid, 512, 100, 0.25) == [
            "pids.max is 256, want 100",
            "cpu.cfs_quota_us is 50000, want 25000",
        ]
    finally:
        await sb.destroy()
