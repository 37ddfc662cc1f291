"""Sandbox models, registry, helpers and the warm pool — no services needed."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sandboxes.base import (
    EvalHeadroom,
    ExecResult,
    RepoSpec,
    Sandbox,
    SandboxBackend,
    SandboxFile,
    SandboxHandle,
    SandboxSpec,
)
from sandboxes.image import base_image as images
from sandboxes.network.gateway_channel import parse_target
from sandboxes.registry import BUILTIN_BACKENDS, backend_class, get_backend, register_backend
from sandboxes.supervision.pool import WarmPool
from sandboxes.workspace.provisioning import files_tar


def test_repo_commit_must_be_immutable() -> None:
    ok = RepoSpec(url="/srv/repo", commit="A" * 40)
    assert ok.commit == "a" * 40
    for bad in ("main", "v1.2", "abc123", "HEAD"):
        with pytest.raises(ValidationError):
            RepoSpec(url="/srv/repo", commit=bad)


def test_spec_and_handle_roundtrip_json() -> None:
    spec = SandboxSpec(
        rollout_id="r1",
        files=[SandboxFile.from_bytes("bin.dat", b"\x00\xff")],
        env={"A": "1"},
        setup=["true"],
    )
    again = SandboxSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and again.files[0].data() == b"\x00\xff"
    with pytest.raises(ValidationError):
        SandboxSpec(rollout_id="r", unknown_field=1)  # type: ignore[call-arg]
    h = SandboxHandle(backend="x", sandbox_id="s", rollout_id="r", env_version="sha256:1")
    assert SandboxHandle.model_validate_json(h.model_dump_json()) == h
    assert ExecResult(exit_code=0).ok and not ExecResult(exit_code=0, oom_killed=True).ok


def test_files_tar_places_relative_paths_under_workdir() -> None:
    data = files_tar(
        [
            SandboxFile(path="a/b.txt", content="x", mode=0o600),
            SandboxFile(path="/etc/agent.conf", content="y"),
        ],
        "/workspace",
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        names = tf.getnames()
        assert "workspace/a/b.txt" in names and "etc/agent.conf" in names
        assert tf.getmember("workspace/a/b.txt").mode == 0o600
        assert tf.getmember("workspace/a").isdir()


def test_parse_gateway_targets() -> None:
    assert parse_target("unix:/run/gw.sock") == ("unix", "/run/gw.sock")
    assert parse_target("unix:///run/gw.sock") == ("unix", "/run/gw.sock")
    assert parse_target("http://127.0.0.1:8000") == ("tcp", ("127.0.0.1", 8000))
    assert parse_target("gw-host:9000") == ("tcp", ("gw-host", 9000))
    with pytest.raises(ValueError):
        parse_target("http://127.0.0.1")


def test_find_debian_mirror_from_deb822_and_list(tmp_path: Path) -> None:
    d = tmp_path / "apt"
    (d / "sources.list.d").mkdir(parents=True)
    (d / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\nComponents: main\n"
    )
    (d / "sources.list.d" / "other.list.disabled").write_text("deb http://nope/debian x main\n")
    assert images.find_debian_mirror(d) == "http://mirror.example/debian"
    d2 = tmp_path / "apt2"
    d2.mkdir()
    (d2 / "sources.list").write_text(
        "# comment\ndeb [arch=amd64] http://ftp.example.org/debian bookworm main\n"
    )
    assert images.find_debian_mirror(d2) == "http://ftp.example.org/debian"
    with pytest.raises(RuntimeError, match="no Debian archive mirror"):
        images.find_debian_mirror(tmp_path / "empty")


def test_recipe_hash_tracks_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    a = images._hash(images.recipe_inputs("http://m/debian"))
    assert a == images._hash(images.recipe_inputs("http://m/debian"))
    assert a != images._hash(images.recipe_inputs("http://other/debian"))
    monkeypatch.setitem(images.VERSIONS, "CODEX_VERSION", "0.0.1")
    assert a != images._hash(images.recipe_inputs("http://m/debian"))


def test_registry_lets_a_new_backend_plug_in_without_harness_changes() -> None:
    class NullBackend(SandboxBackend):
        name = "null"

        async def create(self, spec: SandboxSpec) -> Sandbox:  # pragma: no cover
            raise NotImplementedError

        async def attach(self, handle: SandboxHandle) -> Sandbox:  # pragma: no cover
            raise NotImplementedError

        async def destroy(self, handle: SandboxHandle) -> None:
            return None

        async def list(self) -> list[SandboxHandle]:
            return []

    register_backend("null", NullBackend)
    assert isinstance(get_backend("null"), NullBackend)
    with pytest.raises(KeyError):
        get_backend("no-such-backend")


def test_callers_read_a_backends_capabilities_from_its_class() -> None:
    """No caller lists backend names: a built-in's class says what it can do, a registered
    class declares its own, and a name nobody registered (or a plain factory function)
    reads as a remote backend, never an error."""
    caps = ("host_local", "runs_local_images", "runs_image_rootfs", "egress_relays")
    table = {n: [getattr(backend_class(n), c) for c in caps] for n in BUILTIN_BACKENDS}
    assert table == {
        "local": [True, True, True, True],
        "docker": [True, True, False, True],
        "e2b": [False, False, False, False],
    }

    class HostOnly(SandboxBackend):
        host_local = True

    register_backend("host-only", HostOnly)
    register_backend("by-function", lambda **config: HostOnly())
    assert backend_class("host-only").host_local
    assert backend_class("by-function") is SandboxBackend
    assert backend_class("no-such-backend") is SandboxBackend
    assert not SandboxBackend.host_local


async def test_warm_pool_take_refill_and_close() -> None:
    made: list[int] = []
    discarded: list[int] = []

    async def make(key: Any) -> int:
        await asyncio.sleep(0.01)
        made.append(len(made))
        return made[-1]

    async def discard(item: int) -> None:
        discarded.append(item)

    pool: WarmPool[int] = WarmPool(make, discard, size=3)
    assert pool.take("k") is None  # empty: caller creates cold; refill starts
    await pool.wait_full("k", timeout=5)
    assert pool.idle("k") == 3
    item = pool.take("k")
    assert item is not None and pool.idle("k") == 2
    await pool.wait_full("k", timeout=5)
    assert pool.idle("k") == 3 and len(made) == 4
    pool.paused = True
    pool.take("k")
    await asyncio.sleep(0.05)
    assert pool.idle("k") == 2  # no refill while paused
    await pool.close()
    assert len(discarded) == 2 and item not in discarded and pool.idle("k") == 0
    assert pool.take("k") is None


class _HostShell(Sandbox):
    """Runs `exec` as a host process (stands in for a sandbox to try the damage probe's
    shell script; the real sandboxes run it in tests/integration)."""

    def __init__(self, home: str) -> None:
        self.handle = SandboxHandle(
            backend="host", sandbox_id="h", rollout_id="r", env_version="", env={"HOME": home}
        )

    @property
    def backend(self) -> SandboxBackend:
        raise NotImplementedError

    async def exec(self, cmd: Any, **kw: Any) -> ExecResult:  # type: ignore[override]
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=kw.get("cwd"), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        return ExecResult(exit_code=proc.returncode or 0, stdout=out.decode())

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        raise NotImplementedError

    async def get_archive(self, path: str, *, max_bytes: int = 0) -> bytes:
        raise NotImplementedError

    async def kill_all_processes(self) -> None:
        return None


async def test_the_damage_probe_names_a_missing_workdir_and_passes_an_intact_one(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "work").mkdir()
    sb = _HostShell(str(home))
    assert await sb.agent_damage(str(tmp_path / "work")) is None
    assert not list((tmp_path / "work").iterdir())  # the probe's file is gone again
    gone = str(tmp_path / "removed")
    assert await sb.agent_damage(gone) == f"{gone} is gone"


def test_the_free_space_an_evaluation_needs_by_default() -> None:
    mib = 1024 * 1024
    room = EvalHeadroom()
    assert room.disk_bytes(4096 * mib) == 256 * mib  # 1/16, capped
    assert room.disk_bytes(1024 * mib) == 64 * mib
    assert room.disk_bytes(32 * mib) == 4 * mib  # the floor
    assert room.disk_bytes(4 * mib) == 2 * mib  # never more than half a tiny disk
    assert room.shm_bytes(64 * mib) == 16 * mib and room.shm_bytes(12 << 30) == 16 * mib
    assert room.shm_bytes(8 * mib) == 2 * mib
    given = EvalHeadroom(disk_mb=1.5, shm_mb=0)
    assert (given.disk_bytes(1 << 40), given.shm_bytes(64 * mib)) == (int(1.5 * mib), 0)


async def test_the_damage_probe_measures_free_space_against_the_headroom(tmp_path: Path) -> None:
    """A headroom the host's disk and /dev/shm have: nothing; one they do not have: one
    line per filesystem (workdir, /tmp and home share one here), saying what is free and
    what is needed."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "work").mkdir()
    sb = _HostShell(str(home))
    work = str(tmp_path / "work")
    assert await sb.agent_damage(work, headroom=EvalHeadroom(disk_mb=0, shm_mb=0)) is None
    huge = 1 << 40  # MiB: no host has that free
    damage = await sb.agent_damage(work, headroom=EvalHeadroom(disk_mb=huge, shm_mb=0)) or ""
    assert damage.count("is full") == 1 and f"the disk of {work} is full (" in damage, damage
    assert f"an evaluation needs {huge} MiB, resources.eval_headroom)" in damage
    shm = await sb.agent_damage(work, headroom=EvalHeadroom(disk_mb=0, shm_mb=huge)) or ""
    assert shm.startswith("/dev/shm is full ("), shm


def test_refused_forks_are_read_from_the_pids_cgroup(tmp_path: Path) -> None:
    from sandboxes.isolation.cgroups import pids_limit_hits

    memory, pids = tmp_path / "memory", tmp_path / "pids"
    memory.mkdir()
    pids.mkdir()
    assert pids_limit_hits([str(memory), str(pids)]) is None
    (pids / "pids.events").write_text("max 0\n")
    assert pids_limit_hits([str(memory), str(pids)]) == 0
    (pids / "pids.events").write_text("max 7\n")
    assert pids_limit_hits([str(memory), str(pids)]) == 7


@pytest.mark.parametrize(
    ("limit_file", "limit", "stat", "expected"),
    [
        ("memory.max", "268435456\n", "anon 1\nshmem 184549376\n", (184549376, 268435456)),
        ("memory.max", "max\n", "shmem 5\n", None),  # unlimited: nothing to fill
        ("memory.limit_in_bytes", "268435456\n", "shmem 1\ntotal_shmem 7\n", (7, 268435456)),
        ("memory.limit_in_bytes", "9223372036854771712\n", "total_shmem 7\n", None),
    ],
    ids=["v2", "v2_unlimited", "v1_hierarchical", "v1_unlimited"],
)
def test_memory_held_by_files_is_read_from_the_memory_cgroup(
    tmp_path: Path, limit_file: str, limit: str, stat: str, expected: tuple[int, int] | None
) -> None:
    from sandboxes.isolation.cgroups import memory_held_in_files

    assert memory_held_in_files([str(tmp_path)]) is None
    (tmp_path / limit_file).write_text(limit)
    (tmp_path / "memory.stat").write_text(stat)
    assert memory_held_in_files([str(tmp_path)]) == expected


def test_a_v1_memory_cgroup_finds_its_pids_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker on cgroup v1 tells us only the container's memory cgroup; the refused forks
    are counted in the pids hierarchy at the same place."""
    from sandboxes.isolation import cgroups

    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    memory, pids = tmp_path / "memory/docker/c1", tmp_path / "pids/docker/c1"
    memory.mkdir(parents=True)
    pids.mkdir(parents=True)
    assert cgroups.pids_limit_hits([str(memory)]) is None
    (pids / "pids.events").write_text("max 3\n")
    assert cgroups.pids_limit_hits([str(memory)]) == 3


@pytest.mark.parametrize("existed_before", [True, False])
async def test_a_check_dir_gone_after_the_agent_is_its_doing_a_wrong_path_is_ours(
    tmp_path: Path, existed_before: bool
) -> None:
    """A check whose directory the agent deleted scores 0; a task naming a directory
    that never existed stays an evaluator error (masked)."""
    from hooks.evaluate import _check_dirs, _existing_dirs, evaluate
    from schemas.evaluation import EvaluationSpec

    home, work, tests = tmp_path / "home", tmp_path / "work", tmp_path / "work" / "tests"
    home.mkdir()
    work.mkdir()
    if existed_before:
        tests.mkdir()
    spec = EvaluationSpec.model_validate(
        {"checks": [{"kind": "command", "command": "true", "cwd": "tests"}]}
    )
    sb = _HostShell(str(home))
    before = await _existing_dirs(sb, _check_dirs(spec, str(work)))
    assert before == ([str(tests)] if existed_before else [])
    if existed_before:
        tests.rmdir()  # the agent's doing
    r = await evaluate(sb, spec, str(work), check_dirs=before)
    if existed_before:
        assert r.status == "agent_broke_sandbox" and r.reward == 0.0
        assert r.damage == f"{tests} is gone (a check runs there)"
    else:
        assert r.status == "eval_error" and r.reward is None and r.damage is None
