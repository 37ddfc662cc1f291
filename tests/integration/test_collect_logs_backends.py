"""Log collection never decides a rollout, on the real local (bubblewrap) and docker
backends: an agent leaves a hostile tree in `/logs/agent` — a path longer than the host
can take, deep nesting, a huge file, many files, symlink loops, a FIFO, a file nobody
may read — and the rollout keeps its evaluation and reward while `collect_logs` copies
what it may and records each skip with its reason and limit.

The agent is a shell command (the `command` harness), so no model is needed; the
Gateway stand-in only gives the session an address.
"""

from __future__ import annotations

import errno
import io
import json
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from sandboxes.base import SandboxBackend, SandboxSpec
from schemas.outcome import RolloutStatus
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.llm_stand_in import RecordingLLMServerForTests
from tests.fixtures.runtime import RuntimeManager

pytestmark = pytest.mark.integration

#: 15 dirs of 254 bytes and a 244-byte name: 4,069 bytes below /logs/agent — inside the
#: sandbox's PATH_MAX (4,096 with `/logs/agent/`), past it once under any host dir.
LONG_DIR, LONG_NAME, LONG_DEPTH = "0" * 254, "0" * 240 + ".log", 15
HOSTILE_TREE = rf"""
set -e
printf 'print(42)\n' > hello.py
cd /logs/agent
echo fine > ok.log
( for i in $(seq {LONG_DEPTH}); do mkdir {LONG_DIR}; cd {LONG_DIR}; done; echo long > {LONG_NAME} )
( for i in $(seq 40); do mkdir x; cd x; done; echo deep > deep.log )
head -c 2097152 /dev/zero > huge.log
mkdir many; for i in $(seq 30); do echo $i > many/$i.log; done
ln -s loop loop; ln -s .. many/up
mkfifo pipe
echo secret > locked.log; chmod 000 locked.log
"""
LONG_REL = "/".join([LONG_DIR] * LONG_DEPTH + [LONG_NAME])
CAPS = {"max_file_bytes": 1 << 20, "max_files": 20}
EVALUATION = {
    "checks": [{"kind": "command", "command": 'test "$(python3 hello.py)" = 42', "name": "42"}]
}


@pytest.fixture
def gateway() -> Any:
    with RecordingLLMServerForTests() as srv:
        yield srv


def session_for(srv: RecordingLLMServerForTests) -> SessionCreated:
    return SessionCreated(
        session_id="sess-logs",
        token="tok-logs",
        openai_base_url=f"{srv.url}/v1",
        anthropic_base_url=srv.url,
    )


def hostile_task(backend: str) -> RolloutTask:
    """The default hooks, in their order: the logs are collected before the evaluation,
    so a failed collection would fail the run before any reward."""
    return RolloutTask.model_validate(
        {
            "task_id": "hostile-logs",
            "prompt": "create hello.py that prints 42",
            "sandbox": {"backend": backend},
            "harness": {"name": "command", "config": {"command": HOSTILE_TREE}, "budget_s": 120},
            "evaluation": EVALUATION,
            "hooks": [
                {"name": "collect_logs", "params": CAPS},
                {"name": "capture_diff", "required": False},
                {"name": "evaluate"},
                {"name": "metrics"},
            ],
        }
    )


async def test_a_hostile_log_tree_keeps_the_reward_and_each_skip_is_recorded(
    sandbox_backend: SandboxBackend, gateway: RecordingLLMServerForTests, tmp_path: Path
) -> None:
    rid = f"it-logs-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={sandbox_backend.name: sandbox_backend}).run(
        hostile_task(sandbox_backend.name), session_for(gateway), rid
    )
    assert r.status == RolloutStatus.ok and r.reward == 1.0, (r.error, r.hook_errors)
    manifest = json.loads((tmp_path / rid / "logs" / "collect_logs.json").read_text())
    skipped = {s["sandbox_path"].removeprefix("/logs/agent/"): s for s in manifest["skipped"]}
    long = next(s for p, s in skipped.items() if p.startswith(LONG_DIR))
    assert long["limit"] == "max_path_bytes"
    assert skipped["/".join(["x"] * 40 + ["deep.log"])]["limit"] == "max_depth"
    assert skipped["huge.log"]["limit"] == "max_file_bytes"
    for link in ("loop", "many/up"):
        assert skipped[link]["reason"] == "not a regular file (symlink)"
    assert skipped["pipe"]["reason"] == "not a regular file (fifo)"
    # ok.log and 30 logs in many/ (and locked.log where the backend reads it as root)
    # compete for 20 places.
    readable = "locked.log" not in skipped
    if not readable:  # the local backend reads as the agent's uid
        assert skipped["locked.log"]["reason"].startswith("unreadable in the sandbox: ")
    candidates = {"ok.log", *(f"many/{i}.log" for i in range(1, 31))} | (
        {"locked.log"} if readable else set()
    )
    by_files = {p for p, s in skipped.items() if s["limit"] == "max_files"}
    copied = {
        a.name.removeprefix("logs/task_logs/agent/") for a in r.artifacts if a.kind == "task_logs"
    }
    assert len(copied) == manifest["copied_files"] == 20
    assert copied | by_files == candidates and not copied & by_files
    for limit in ("max_path_bytes", "max_depth", "max_file_bytes", "max_files"):
        assert sum(f"{limit}=" in e for e in r.hook_errors) == 1, r.hook_errors


async def test_control_the_long_path_fails_the_host_copy_as_it_was_made(
    sandbox_backend: SandboxBackend, tmp_path: Path
) -> None:
    """The same tree, read out of a real sandbox: its long path is in the archive, and
    the host cannot create the file where the copy put it before (the per-location copy
    raised there, failing the required hook and the run)."""
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=f"it-logs-{time.monotonic_ns()}"))
    try:
        assert (await sb.exec(HOSTILE_TREE, timeout=120)).ok
        raw = await sb.get_archive("/logs/agent")
    finally:
        await sb.destroy()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        names = tf.getnames()
    assert f"agent/{LONG_REL}" in names
    old_target = tmp_path / "logs" / "task_logs" / "agent" / PurePosixPath(LONG_REL)
    with pytest.raises(OSError) as refused:  # the two host calls of that copy
        old_target.parent.mkdir(parents=True, exist_ok=True)
        old_target.write_bytes(b"long\n")
    assert refused.value.errno == errno.ENAMETOOLONG
