"""Rollout workflow contracts without services: tasks, batch planning, queue names, sandbox
spec building, sample storage (local and S3 via moto's in-process mock), GRPO."""

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from moto import mock_aws

from activities.sandbox import build_spec, gateway_channel
from examples.make_tasks import example_tasks
from examples.make_tasks import task as make_task
from examples.trainer_loop import grpo_advantages
from harnesses.base import rebase_url
from rollout_client.client import RolloutClient
from rollout_client.storage import read_many, read_table, write_table
from schemas.rollout import (
    DestroyRequest,
    ProvisionRequest,
    QueueNames,
    SandboxClaim,
    SandboxRef,
    SessionRef,
)
from schemas.samples import SampleRow, UnknownSchemaVersionError, rows_to_table, samples_uri
from schemas.tasks import RolloutTask, load_tasks

REPO = Path(__file__).resolve().parents[2]


def row(rid: str, group: str, reward: float, status: str = "ok") -> SampleRow:
    return SampleRow(
        rollout_id=rid,
        task_id="t",
        group_id=group,
        segment_id=f"seg-{rid}",
        scene="main",
        prompt_ids=[1],
        response_ids=[2, 3],
        loss_mask=[1, 1] if status != "infra_error" else [0, 0],
        logprobs=[-0.1, -0.2],
        reward=reward,
        status=status,
        policy_version="p",
        env_version="e",
        prompt_template_version="t",
        reward_fn_version="r",
        harness="command",
        harness_version="1",
        sampling="{}",
        seed=1,
    )


def test_example_tasks_file_is_current_and_valid() -> None:
    tasks = load_tasks(REPO / "examples" / "tasks.jsonl")
    assert [t.task_id for t in tasks] == [t["task_id"] for t in example_tasks()]
    assert all(t.harness.name == "command" and t.evaluation for t in tasks)


def test_real_agent_example_tasks_are_valid() -> None:
    from harnesses.registry import get_harness

    tasks = load_tasks(REPO / "examples" / "tasks_real_agents.jsonl")
    assert tasks and all(t.evaluation for t in tasks)
    for task in tasks:
        assert get_harness(task.harness.name, task.harness.config) is not None


def test_load_tasks_names_the_bad_line(tmp_path: Path) -> None:
    good = json.dumps(make_task("a", "p", "x"))
    path = tmp_path / "t.jsonl"
    path.write_text(good + "\n\n# comment\n" + json.dumps({"task_id": "b", "prompt": "p"}) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:4: invalid task"):
        load_tasks(path)
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(ValueError, match="duplicate task_id 'a'"):
        load_tasks(path)


def test_unknown_task_field_is_rejected() -> None:
    data = make_task("a", "p", "x")
    data["harnes"] = {}
    with pytest.raises(ValueError, match="harnes"):
        RolloutTask.model_validate(data)


def test_plan_groups_ids_and_seeds() -> None:
    client = RolloutClient(client=None, task_queue="q")  # type: ignore[arg-type]
    tasks = [RolloutTask.model_validate(make_task(t, "p", "x")) for t in ("a", "b")]
    batch, reqs = client.plan(tasks, "/out", samples_per_task=3, batch_id="b1")
    assert batch.rollout_ids == [f"b1-{t}-{i}" for t in "ab" for i in range(3)]
    assert batch.groups == {"b1-a": batch.rollout_ids[:3], "b1-b": batch.rollout_ids[3:]}
    seeds = [r.seed for r in reqs]
    assert None not in seeds and len(set(seeds)) == 6
    _, again = client.plan(tasks, "/out", samples_per_task=3, batch_id="b1")
    assert [r.seed for r in again] == seeds  # reproducible per batch
    with pytest.raises(ValueError, match="batch_id"):
        client.plan(tasks, "/out", batch_id="bad id!")


def test_queue_names() -> None:
    q = QueueNames(base="rollouts")
    assert (q.sandbox, q.gateway) == ("rollouts-sandbox", "rollouts-gateway")
    assert q.host("h1") == "rollouts-host-h1" and q.gateway_owner("g") == "rollouts-gateway-g"


def _provision(sandbox: dict) -> ProvisionRequest:
    task = RolloutTask.model_validate({**make_task("a", "p", "x"), "sandbox": sandbox})
    return ProvisionRequest(
        rollout_id="r1",
        attempt=1,
        task=task,
        session=SessionRef(
            session_id="s",
            token="k",
            openai_base_url="http://10.0.0.5:8700/v1",
            anthropic_base_url="http://10.0.0.5:8700",
            gateway_url="http://10.0.0.5:8700",
            owner_queue="q",
        ),
        timeout_s=100,
    )


def test_build_spec_adds_rollout_channel_and_labels() -> None:
    spec = build_spec(_provision({"backend": "local", "env": {"A": "1"}}))
    assert spec.rollout_id == "r1" and spec.env == {"A": "1"} and spec.timeout_s == 100
    assert spec.gateway is not None and spec.gateway.target == "http://10.0.0.5:8700"
    assert spec.labels["agentic-rollout.rollout-id"] == "r1"
    assert spec.labels["agentic-rollout.attempt"] == "1"  # what a SandboxClaim names
    remote = build_spec(_provision({"backend": "e2b"}))
    assert remote.gateway is not None and remote.gateway.public_url == "http://10.0.0.5:8700"


@pytest.mark.parametrize("backend", ["local", "docker", "e2b"])
def test_gateway_behind_a_path_prefix_is_reached_once_through_the_channel(backend: str) -> None:
    """The channel points at the Gateway's origin; the session URL keeps its path when
    rebased onto the sandbox side, so the prefix appears exactly once inside."""
    session_url = "http://10.0.0.5:8700/gw/v1"
    channel = gateway_channel(backend, session_url)
    host_side = channel.target or channel.public_url
    assert host_side == "http://10.0.0.5:8700"
    inside = "http://127.0.0.1:18080" if channel.target else channel.public_url
    assert rebase_url(session_url, inside) == f"{inside}/gw/v1"


def test_destroy_request_names_exactly_one_sandbox() -> None:
    claim = SandboxClaim(backend="local", host="h", host_queue="q-h", rollout_id="r1", attempt=1)
    ref = SandboxRef(
        backend="local", sandbox_id="s", host="h", host_queue="q-h", env_version="e", handle={}
    )
    assert DestroyRequest(claim=claim).claim == claim
    assert DestroyRequest(sandbox=ref).sandbox == ref
    for both_or_none in ({}, {"claim": claim, "sandbox": ref}):
        with pytest.raises(ValueError, match="exactly one of `sandbox` and `claim`"):
            DestroyRequest.model_validate(both_or_none)


def test_build_spec_rejects_bad_specs() -> None:
    with pytest.raises(ValueError, match="full commit hash"):
        build_spec(_provision({"repo": {"url": "/r", "commit": "main"}}))
    with pytest.raises(ValueError, match="imagee"):
        build_spec(_provision({"imagee": "x"}))


def test_local_storage_roundtrip_and_version_check(tmp_path: Path) -> None:
    uri = samples_uri(str(tmp_path / "out"), "r1")
    write_table(rows_to_table([row("r1", "g", 1.0)]), uri)
    write_table(rows_to_table([row("r1", "g", 0.5)]), uri)  # a retry replaces, atomically
    table = read_table(uri)
    assert table.num_rows == 1 and table.column("reward").to_pylist() == [0.5]
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]
    assert read_many([]).num_rows == 0
    foreign = rows_to_table([row("r2", "g", 1.0)]).replace_schema_metadata(
        {b"agentic_rollout.schema_version": b"99"}
    )
    import pyarrow.parquet as pq

    pq.write_table(foreign, tmp_path / "out" / "r2.parquet")
    with pytest.raises(UnknownSchemaVersionError):
        read_table(str(tmp_path / "out"))


def test_local_samples_are_synced_before_and_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine crash must not leave `<rollout>.parquet` named but empty, or unnamed."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        events.append(f"fsync {path.name} ({path.stat().st_size if path.is_file() else 'dir'})")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(f"rename to {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    uri = samples_uri(str(tmp_path / "out"), "r1")
    size = write_table(rows_to_table([row("r1", "g", 1.0)]), uri)
    tmp_name = events[0].split()[1]
    assert tmp_name.startswith(".r1.parquet.") and tmp_name.endswith(".tmp")
    assert events == [f"fsync {tmp_name} ({size})", "rename to r1.parquet", "fsync out (dir)"]


def test_s3_storage_roundtrip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        import boto3

        from rollout_client import storage

        storage._s3_client.cache_clear()
        boto3.client("s3").create_bucket(Bucket="samples")
        for rid in ("r1", "r2"):
            write_table(rows_to_table([row(rid, "g", 1.0)]), samples_uri("s3://samples/b1", rid))
        assert read_table("s3://samples/b1/r1.parquet").num_rows == 1
        assert sorted(read_table("s3://samples/b1").column("rollout_id").to_pylist()) == [
            "r1",
            "r2",
        ]
        storage._s3_client.cache_clear()


def test_grpo_advantages_per_group_over_rollouts() -> None:
    table = rows_to_table(
        [
            row("a0", "ga", 1.0),
            row("a1", "ga", 0.0),
            row("b0", "gb", 1.0),
            row("b1", "gb", 1.0),
            row("b2", "gb", 0.0, status="infra_error"),
        ]
    )
    out = grpo_advantages(table)
    ids, values = out.column("rollout_id").to_pylist(), out.column("advantage").to_pylist()
    adv = dict(zip(ids, values, strict=True))
    assert adv["a0"] == pytest.approx(1.0, abs=1e-4)
    assert adv["a1"] == pytest.approx(-1.0, abs=1e-4)
    assert adv["b0"] == adv["b1"] == 0.0 and adv["b2"] == 0.0
    assert isinstance(out, pa.Table) and out.num_rows == 5


async def test_host_capacity_blocks_provisions_while_the_host_is_full() -> None:
    """A provision slot is granted only while live + in-flight < max live sandboxes."""
    import asyncio

    from activities.sandbox import HostCapacity

    cap = HostCapacity(max_live=2, max_provisions=5)
    ctx = None  # the context is not used by the supplier
    first = await cap.reserve_slot(ctx)  # type: ignore[arg-type]
    cap.set_live(1)  # first provision done: one live sandbox
    cap.release_slot(ctx)  # type: ignore[arg-type]
    await cap.reserve_slot(ctx)  # type: ignore[arg-type]
    assert first is not None and (cap.live, cap.reserved) == (1, 1)
    assert cap.try_reserve_slot(ctx) is None  # type: ignore[arg-type]
    waiting = asyncio.ensure_future(cap.reserve_slot(ctx))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not waiting.done()
    cap.set_live(0)  # a destroy frees room
    await asyncio.wait_for(waiting, 1)
    assert cap.reserved == 2
