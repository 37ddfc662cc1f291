"""`collect_logs` copies each file on its own: a file past a cap, one the host cannot
write, or a member that is not a regular file is skipped and recorded — never a failed
hook. The archives are built here with `tarfile` (what a sandbox's tar stream holds);
the real backends' streams are in tests/integration/test_collect_logs_backends.py."""

from __future__ import annotations

import errno
import io
import json
import tarfile
from pathlib import Path

import pytest

from hooks.base import HookContext, build_hooks
from hooks.collect_logs import LogCaps, collect_log_files
from schemas.outcome import LogSpec, RunOutcome
from schemas.tasks import HookSpec, RolloutTask
from tests.fixtures.fake_sandbox import FakeSandbox

LONG = "/".join(["d" * 250] * 17) + "/f.log"  # 4,3xx bytes: past the host's PATH_MAX
DEEP = "/".join(f"l{i}" for i in range(40)) + "/deep.log"


class TarSandbox(FakeSandbox):
    """Hands out one prebuilt archive for every location (a FAKE sandbox: the stream's
    shape is what is under test)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__()
        self.raw = raw

    async def get_archive(self, path: str, *, max_bytes: int = 0) -> bytes:
        return self.raw


def archive(files: dict[str, bytes], special: dict[str, bytes] | None = None) -> bytes:
    """A tar rooted at `agent/`; `special`: name → tar type (symlink to itself, fifo)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(f"agent/{name}")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        for name, kind in (special or {}).items():
            ti = tarfile.TarInfo(f"agent/{name}")
            ti.type = kind
            ti.linkname = name
            tf.addfile(ti)
    return buf.getvalue()


def ctx_for(tmp_path: Path, sb: FakeSandbox) -> HookContext:
    task = RolloutTask(task_id="t-1", prompt="p", harness={"name": "command"})
    return HookContext(
        rollout_id="r-1",
        task=task,
        sandbox=sb,
        workdir="/workspace",
        artifacts_dir=tmp_path / "artifacts",
        outcome=RunOutcome(harness="command"),
    )


async def test_each_file_past_a_cap_is_skipped_and_named_by_its_limit(tmp_path: Path) -> None:
    files = {
        "ok.log": b"fine",
        "big.log": b"x" * 5000,
        DEEP: b"deep",
        "n" * 256 + ".log": b"long name",
        "p/" + "q" * 200 + "/" + "r" * 200 + ".log": b"long path",
        **{f"many/{i:02d}.log": b"m" for i in range(8)},
    }
    specials = {"loop": tarfile.SYMTYPE, "pipe": tarfile.FIFOTYPE}
    sb = TarSandbox(archive(files, specials))
    ctx = ctx_for(tmp_path, sb)
    params = {
        "task_dirs": False,
        "extra": [{"path": "/logs/agent", "kind": "task_logs"}],
        **{"max_file_bytes": 1000, "max_depth": 8, "max_path_bytes": 300, "max_files": 5},
    }
    [hook] = build_hooks([HookSpec(name="collect_logs", params=params)])
    await hook.after_run(ctx)
    copied = sorted(a.name for a in ctx.outcome.artifacts if a.kind == "task_logs")
    first = [f"many/0{i}.log" for i in range(4)]
    assert copied == [f"logs/task_logs/agent/{n}" for n in [*first, "ok.log"]]
    manifest = json.loads((ctx.artifacts_dir / "logs/collect_logs.json").read_text())
    limits = {
        s["sandbox_path"].removeprefix("/logs/agent/")[:12]: s["limit"] for s in manifest["skipped"]
    }
    assert limits == {
        "big.log": "max_file_bytes",
        DEEP[:12]: "max_depth",
        "n" * 12: "NAME_MAX",
        "p/" + "q" * 10: "max_path_bytes",
        "many/04.log": "max_files",
        "many/05.log": "max_files",
        "many/06.log": "max_files",
        "many/07.log": "max_files",
        "loop": None,
        "pipe": None,
    }
    reasons = {s["sandbox_path"]: s["reason"] for s in manifest["skipped"]}
    assert reasons["/logs/agent/loop"] == "not a regular file (symlink)"
    assert reasons["/logs/agent/pipe"] == "not a regular file (fifo)"
    assert manifest["copied_files"] == 5 and manifest["skipped_count"] == 10
    errors = ctx.outcome.hook_errors
    assert len(errors) == 5  # one line per cap hit; the symlink and fifo are not errors
    assert "collect_logs: 4 skipped: max_files=5 files copied already (first: " in errors[-1]


async def test_a_file_the_host_cannot_write_is_skipped_and_the_rest_copied(
    tmp_path: Path,
) -> None:
    """A path that fits the sandbox but not the host (with the path caps lifted): the
    host's own error, for that file only."""
    sb = TarSandbox(archive({"a.log": b"a", LONG: b"long", "z.log": b"z"}))
    errors: list[str] = []
    caps = LogCaps(max_path_bytes=10_000, max_depth=100)
    got = await collect_log_files(
        sb, tmp_path, [LogSpec(path="/logs/agent")], caps=caps, errors=errors
    )
    assert [Path(f.local_path or "").name for f in got] == ["a.log", "z.log"]
    [error] = errors
    assert error.startswith("skipped /logs/agent/ddd") and "copy failed:" in error
    assert "File name too long" in error
    # Control: the host refuses that path as such (what failed the hook before).
    with pytest.raises(OSError) as refused:
        (tmp_path / "log" / "agent" / LONG).parent.mkdir(parents=True)
    assert refused.value.errno == errno.ENAMETOOLONG


async def test_an_archive_cut_short_keeps_what_came_before_and_says_so(tmp_path: Path) -> None:
    raw = archive({"a.log": b"a" * 100, "b.log": b"b" * 2000})
    cut = raw[: 512 + 512 + 512 + 700]  # a.log whole, b.log's data cut
    errors: list[str] = []
    got = await collect_log_files(
        TarSandbox(cut), tmp_path, [LogSpec(path="/logs/agent")], errors=errors
    )
    assert [Path(f.local_path or "").name for f in got] == ["a.log"]
    assert errors == [
        "skipped /logs/agent/b.log: copy failed: unexpected end of data",
        "skipped /logs/agent: archive ended early after /logs/agent/b.log: unexpected end of data",
    ]
    # Cut between two files (the sandbox's tar stopped there): no member is broken, but
    # the archive has no end, so the loss is recorded.
    errors.clear()
    got = await collect_log_files(
        TarSandbox(raw[:1024]), tmp_path / "2", [LogSpec(path="/logs/agent")], errors=errors
    )
    assert [Path(f.local_path or "").name for f in got] == ["a.log"]
    assert errors == [
        "skipped /logs/agent: archive ended early after /logs/agent/a.log: nothing more was read"
    ]
    # Not a tar at all: the location is skipped, and said so.
    errors.clear()
    got = await collect_log_files(
        TarSandbox(b""), tmp_path / "3", [LogSpec(path="/logs/agent")], errors=errors
    )
    assert got == [] and errors == ["skipped /logs/agent: archive unreadable: empty file"]


async def test_total_bytes_cap_skips_what_would_pass_it(tmp_path: Path) -> None:
    sb = TarSandbox(archive({"a.log": b"a" * 600, "b.log": b"b" * 600, "c.log": b"c" * 300}))
    errors: list[str] = []
    caps = LogCaps(max_total_bytes=1000)
    got = await collect_log_files(
        sb, tmp_path, [LogSpec(path="/logs/agent")], caps=caps, errors=errors
    )
    assert [Path(f.local_path or "").name for f in got] == ["a.log", "c.log"]
    assert errors == ["skipped /logs/agent/b.log: would pass max_total_bytes=1000"]
