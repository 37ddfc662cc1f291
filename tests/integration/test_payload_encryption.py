"""Session tokens never sit in plain text in Temporal history: with a payload key, every
payload is AES-GCM encrypted (`rollout_client.codec`). Real parts: the Temporal dev server, a
`RolloutWorker` (role all, in this process), the Gateway in front of the scripted
engine, a local bubblewrap sandbox and the example agent making real calls.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from temporalio.api.enums.v1 import EventType

from devstack.ports import free_port
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from rollout_client.client import RolloutClient
from rollout_client.codec import PayloadKeyError, new_key, parse_key
from schemas.outcome import RolloutStatus
from schemas.rollout import CREATE_SESSION, RolloutResult, SessionRef
from schemas.tasks import RolloutTask
from tests.fixtures.gateway import served_gateway
from tests.fixtures.rollout_stack import work_dir, worker_in_process
from workers.codec_server import codec_app
from workers.local_stack import InProcessGateway
from workers.worker import RolloutWorker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image", "vllm_venv"),
]
QUEUE = "codec-tests"
CODEC_TOKEN = "codec-test-token"


@dataclass
class Stack:
    key: bytes
    gateway: InProcessGateway
    worker: RolloutWorker


@pytest.fixture(scope="module")
def gateway_stack() -> Iterator[tuple[InProcessGateway, Path]]:
    model = ensure_tiny_model()
    engine = ScriptedEngine(
        model / "tokenizer.json",
        Script(rules=[ScriptRule(when_contains="6 times 7", reply="42", repeat=True)]),
    )
    with (
        work_dir("codec") as work,
        served_gateway(engine.app(), model, work / "gateway", "tiny") as gateway,
    ):
        yield gateway, work


@pytest.fixture(scope="module")
async def stack(
    temporal_server: TemporalDevServer, gateway_stack: tuple[InProcessGateway, Path]
) -> AsyncIterator[Stack]:
    gateway, work = gateway_stack
    key_text = new_key()
    (work / "payload.key").write_text(key_text + "\n")
    async with worker_in_process(
        temporal_server, QUEUE, "codec-host", gateway, work, payload_key_file=work / "payload.key"
    ) as worker:
        yield Stack(parse_key(key_text), gateway, worker)


async def run_one(client: RolloutClient) -> Any:
    task = RolloutTask.model_validate(make_task("mul", "What is 6 times 7? Number only.", "42"))
    batch = await client.submit([task], "/tmp/unused-samples", 1)
    [rid] = batch.rollout_ids
    return client.client.get_workflow_handle(rid, result_type=RolloutResult)


async def session_token(client: RolloutClient, handle: Any) -> str:
    """The session token as the (keyed) client decodes it from history."""
    conv = client.client.data_converter
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            [value] = await conv.decode(done.result.payloads, [Any])
            if isinstance(value, dict) and "token" in value:
                return SessionRef.model_validate(value).token
    raise AssertionError(f"no {CREATE_SESSION} result in history")


async def test_history_holds_no_session_token_and_the_rollout_works(
    stack: Stack, temporal_server: TemporalDevServer
) -> None:
    client = await RolloutClient.connect(
        temporal_server.address, task_queue=QUEUE, payload_keys=[stack.key]
    )
    handle = await run_one(client)
    result = await asyncio.wait_for(handle.result(), 180)
    assert (result.status, result.reward) == (RolloutStatus.ok, 1.0)
    token = await session_token(client, handle)
    secret = token.split(".", 1)[1]
    assert len(secret) >= 24

    plain = await RolloutClient.connect(temporal_server.address, task_queue=QUEUE, payload_keys=[])
    history = await plain.client.get_workflow_handle(handle.id).fetch_history()
    raw = b"".join(e.SerializeToString() for e in history.events)
    assert secret.encode() not in raw
    assert history.to_json().count(secret) == 0
    # what operators filter on stays readable without the key
    desc = await plain.client.get_workflow_handle(handle.id).describe()
    assert desc.search_attributes["RolloutStatus"] == ["ok"]


async def test_wrong_key_gives_a_clear_error(
    stack: Stack, temporal_server: TemporalDevServer
) -> None:
    client = await RolloutClient.connect(
        temporal_server.address, task_queue=QUEUE, payload_keys=[stack.key]
    )
    handle = await run_one(client)
    await asyncio.wait_for(handle.result(), 180)
    other = parse_key(new_key())
    wrong = await RolloutClient.connect(
        temporal_server.address, task_queue=QUEUE, payload_keys=[other]
    )
    with pytest.raises(PayloadKeyError, match=r"payload encrypted with key id '[0-9a-f]{16}'"):
        await wrong.client.get_workflow_handle(handle.id, result_type=RolloutResult).result()


def payload_texts(history_json: str) -> list[tuple[str, str]]:
    """(encoding, data as text) of every payload in `temporal workflow show -o json`
    except search attributes."""
    out: list[tuple[str, str]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "data" in node and "metadata" in node and "encoding" in node["metadata"]:
                enc = base64.b64decode(node["metadata"]["encoding"]).decode()
                out.append((enc, base64.b64decode(node["data"]).decode(errors="replace")))
            for k, v in node.items():
                if k != "searchAttributes":  # never codec-encoded: readable by design
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(history_json))
    return out


@pytest.fixture
def codec_server(stack: Stack) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            codec_app([stack.key], token=CODEC_TOKEN),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "codec server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


async def test_codec_server_shows_history_to_the_temporal_cli(
    stack: Stack, temporal_server: TemporalDevServer, codec_server: str
) -> None:
    """How operators read a sealed history: `temporal workflow show --codec-endpoint`."""
    client = await RolloutClient.connect(
        temporal_server.address, task_queue=QUEUE, payload_keys=[stack.key]
    )
    handle = await run_one(client)
    await asyncio.wait_for(handle.result(), 180)
    token = await session_token(client, handle)
    binary = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    base = [binary, "workflow", "show", "-w", handle.id, "--address", temporal_server.address]
    base += ["--output", "json"]

    async def show(*extra: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            *base, *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode()

    sealed = payload_texts(await show())
    assert sealed and all(enc == "binary/encrypted" for enc, _ in sealed)
    auth = ["--codec-endpoint", codec_server, "--codec-auth", f"Bearer {CODEC_TOKEN}"]
    opened = payload_texts(await show(*auth))
    assert "binary/encrypted" not in {enc for enc, _ in opened}
    assert any(token in text for _, text in opened)
    bad = httpx.post(
        f"{codec_server}/decode",
        json={"payloads": "nope"},
        headers={"Authorization": f"Bearer {CODEC_TOKEN}"},
    )
    assert bad.status_code == 400
