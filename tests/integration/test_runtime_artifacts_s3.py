"""Integration: a rollout's artifacts land in S3 (moto's S3 server on loopback) and the
result carries their s3:// URIs — also when the rollout failed (on_error upload)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from activities.runtime import RuntimeFailure
from devstack.ports import free_port
from hooks.base import Hook, HookContext, register_hook
from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus
from schemas.session import SessionCreated
from schemas.tasks import HookSpec, RolloutTask
from tests.fixtures.llm_stand_in import RecordingLLMServerForTests
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    local_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.integration
BUCKET = "rollout-artifacts"


@register_hook
class FailAfterRunHook(Hook):
    """Test hook: a required hook that breaks after the agent ran."""

    name = "test_fail_after_run"

    async def after_run(self, ctx: HookContext) -> None:
        raise RuntimeError("reporting backend down")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server on a free loopback port; yields its endpoint URL."""
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
    try:
        yield url
    finally:
        server.stop()


def task(command: str, s3_url: str, **kw: object) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": "hello-s3",
            "prompt": "create hello.py that prints 42",
            "sandbox": {"backend": "local"},
            "harness": {"name": "command", "config": {"command": command}, "budget_s": 60},
            "evaluation": {
                "checks": [{"kind": "command", "command": 'test "$(python3 hello.py)" = 42'}]
            },
            "hooks": [
                {"name": "collect_logs"},
                {"name": "capture_diff"},
                {"name": "evaluate"},
                {"name": "metrics"},
                {
                    "name": "upload_artifacts",
                    "params": {"dest": f"s3://{BUCKET}/runs", "endpoint_url": s3_url},
                },
            ],
            **kw,
        }
    )


def session(srv: RecordingLLMServerForTests) -> SessionCreated:
    return SessionCreated(
        session_id="s", token="t", openai_base_url=f"{srv.url}/v1", anthropic_base_url=srv.url
    )


def keys(s3_url: str, prefix: str) -> set[str]:
    listing = boto3.client("s3", endpoint_url=s3_url).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"] for o in listing.get("Contents", [])}


async def test_artifacts_are_uploaded_to_s3(
    local_backend: SandboxBackend,  # noqa: F811
    s3: str,
    tmp_path: Path,
) -> None:
    with RecordingLLMServerForTests() as srv:
        r = await RuntimeManager(tmp_path, backends={"local": local_backend}).run(
            task("printf 'print(42)\\n' > hello.py", s3), session(srv), "s3-ok"
        )
    assert r.status == RolloutStatus.ok and r.reward == 1.0
    got = keys(s3, "runs/s3-ok/")
    want = {f"runs/s3-ok/{n}" for n in ("diff.patch", "evaluation.json", "metrics.json")}
    assert want <= got and "runs/s3-ok/agent/agent.stdout.log" in got
    uris = {a.name: a.uri for a in r.artifacts}
    assert uris["diff.patch"] == f"s3://{BUCKET}/runs/s3-ok/diff.patch"
    body = boto3.client("s3", endpoint_url=s3).get_object(
        Bucket=BUCKET, Key="runs/s3-ok/diff.patch"
    )["Body"]
    assert b"+print(42)" in body.read()


async def test_artifacts_are_uploaded_when_the_rollout_fails(
    local_backend: SandboxBackend,  # noqa: F811
    s3: str,
    tmp_path: Path,
) -> None:
    """A required hook fails after the agent ran, before the evaluation (after it, the
    failure is only recorded): on_error still uploads what exists."""
    t = task("printf 'print(42)\\n' > hello.py", s3)
    t.hooks.insert(2, HookSpec(name="test_fail_after_run"))
    with RecordingLLMServerForTests() as srv, pytest.raises(RuntimeFailure) as exc:
        await RuntimeManager(tmp_path, backends={"local": local_backend}).run(
            t, session(srv), "s3-fail"
        )
    assert exc.value.outcome.status == RolloutStatus.infra_error
    got = keys(s3, "runs/s3-fail/")
    assert "runs/s3-fail/diff.patch" in got and "runs/s3-fail/metrics.json" in got
    assert all(a.uri and a.uri.startswith("s3://") for a in exc.value.outcome.artifacts)
