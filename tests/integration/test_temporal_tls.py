"""TLS, mTLS and an API key between the workers / trainer client and Temporal.

The real dev server has no TLS options (`temporal server start-dev --help`, CLI 1.9.1),
so it sits behind `TlsFrontendForTests` (a FAKE of a cluster's TLS frontend: stdlib
`ssl`, client certificates required, records each call's `authorization` header). The
certificates are made in the test with `cryptography`. Everything else is real: a
`python -m workers.worker` process configured only through the TLS options and
`TEMPORAL_API_KEY`, the Gateway, the scripted engine, a local bubblewrap sandbox.
"""

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from rollout_client.client import RolloutClient
from rollout_client.temporal_connection import TemporalConnectError, TemporalTLS
from schemas.tasks import RolloutTask
from tests.fixtures.temporal_tls import Pki, TlsFrontendForTests, make_pki
from tests.fixtures.worker_process import one_host_args
from workers.local_stack import start_gateway

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

API_KEY = "tls-test-key-" + os.urandom(6).hex()
QUEUE = "tls-tests"


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rollout-tls-", dir="/tmp"))
    path.chmod(0o755)  # the sandbox uid must traverse the local backend's state dir
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def pki(work: Path) -> Pki:
    return make_pki(work / "pki", "cluster")


@pytest.fixture(scope="module")
def frontend(temporal_server: TemporalDevServer, pki: Pki) -> Iterator[TlsFrontendForTests]:
    running = TlsFrontendForTests(temporal_server.address, pki).start()
    yield running
    running.stop()


def tls_options(pki: Pki) -> list[str]:
    return [
        f"--temporal-tls-ca={pki.ca}",
        f"--temporal-tls-cert={pki.client_cert}",
        f"--temporal-tls-key={pki.client_key}",
    ]


def start_worker(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.worker", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_for_line(proc: subprocess.Popen[bytes], log: Path, text: str) -> str:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content or proc.poll() is not None:
            return content
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in the worker log:\n{log.read_text()[-3000:]}")


def noop_task() -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": "tls",
            "prompt": "noop",
            "harness": {"name": "command", "config": {"command": "true"}, "budget_s": 60},
            "sandbox": {"backend": "local", "resources": {"memory_mb": 256, "pids": 64}},
            "hooks": [{"name": "metrics", "params": {"write_file": False}}],
        }
    )


async def test_worker_and_trainer_run_a_rollout_over_mtls_with_an_api_key(
    frontend: TlsFrontendForTests, pki: Pki, work: Path
) -> None:
    """A worker started with only `--temporal-tls-*` and `TEMPORAL_API_KEY`, and a
    trainer client given the same settings, run a rollout through the TLS frontend:
    every call they make carries the API key, and every TLS handshake succeeded."""
    model = ensure_tiny_model()
    engine = BackgroundServer(
        ScriptedEngine(model / "tokenizer.json", Script(default_reply="42")).app()
    ).start()
    gateway = start_gateway(engine.url, model, work / "gateway", "tiny")
    log = work / "worker.log"
    env = dict(os.environ, TEMPORAL_API_KEY=API_KEY)
    worker = start_worker(
        one_host_args(
            frontend.address,
            QUEUE,
            "tls-host",
            gateway.control_url,
            gateway.admin_token,
            work,
            *tls_options(pki),
        ),
        log,
        env,
    )
    try:
        text = wait_for_line(worker, log, "worker up")
        assert f"over TLS with CA {pki.ca}, client cert {pki.client_cert}, API key" in text
        settings = TemporalTLS(
            tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key, api_key=API_KEY
        )
        client = await RolloutClient.connect(frontend.address, task_queue=QUEUE, tls=settings)
        batch = await client.submit([noop_task()], str(work / "samples"))
        outcome = await asyncio.wait_for(client.outcome(batch.rollout_ids[0]), 180)
        assert outcome.ok, outcome.error
    finally:
        stop(worker)
        gateway.server.stop()
        engine.stop()
    assert not list((work / "sandboxes").glob("lsb-*"))
    assert frontend.handshake_errors == []
    assert frontend.handshakes_ok >= 2  # the worker's connection and the trainer's
    assert len(frontend.authorizations) > 10
    assert set(frontend.authorizations) == {f"Bearer {API_KEY}"}


async def test_a_server_cert_from_another_ca_is_a_clear_error(
    frontend: TlsFrontendForTests, pki: Pki, work: Path
) -> None:
    """Trusting the wrong CA fails the connect with a message naming the CA setting."""
    wrong = make_pki(work / "wrong-pki", "wrong")
    settings = TemporalTLS(tls_ca=wrong.ca, tls_cert=pki.client_cert, tls_key=pki.client_key)
    with pytest.raises(TemporalConnectError) as caught:
        await RolloutClient.connect(frontend.address, task_queue=QUEUE, tls=settings)
    assert str(caught.value).startswith(
        f"cannot connect to Temporal at {frontend.address} with TLS with CA {wrong.ca}, "
        f"client cert {pki.client_cert}: the server's TLS certificate is not signed by the "
        f"CA in {wrong.ca} (--temporal-tls-ca / TEMPORAL_TLS_SERVER_CA_CERT_PATH). Cause: "
    )


async def test_the_worker_with_a_wrong_ca_exits_with_that_reason(
    frontend: TlsFrontendForTests, pki: Pki, work: Path
) -> None:
    """The worker process does not start against a server its CA did not sign: it exits
    non-zero, the reason in its log."""
    wrong = make_pki(work / "wrong-worker-pki", "wrong")
    log = work / "worker-wrong-ca.log"
    worker = start_worker(
        [
            "--role=orchestrator",
            f"--temporal={frontend.address}",
            f"--temporal-tls-ca={wrong.ca}",
            f"--temporal-tls-cert={pki.client_cert}",
            f"--temporal-tls-key={pki.client_key}",
            f"--task-queue={QUEUE}-wrong",
        ],
        log,
        dict(os.environ),
    )
    try:
        assert worker.wait(timeout=60) != 0
    finally:
        stop(worker)
    assert f"the server's TLS certificate is not signed by the CA in {wrong.ca}" in log.read_text()


async def test_without_a_client_certificate_the_error_asks_for_one(
    frontend: TlsFrontendForTests, pki: Pki
) -> None:
    """The cluster requires mTLS: a client with only the CA is told it needs a cert."""
    with pytest.raises(TemporalConnectError, match="it wants a client certificate it trusts"):
        await RolloutClient.connect(
            frontend.address, task_queue=QUEUE, tls=TemporalTLS(tls_ca=pki.ca)
        )
