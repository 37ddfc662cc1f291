"""Every series of a worker's fleet metrics, moved by a real batch and scraped from
`rollout worker --metrics-port` while `rollout run` runs it.

Real parts: the Temporal dev server, a worker process with every role (local bubblewrap
sandboxes, a warm pool of one), the Gateway in front of the scripted engine (a FAKE LLM
that follows a script) behind a gate that holds the agents' calls while the test looks,
and `rollout run` as a process. One fault is injected on purpose: the first session
create is answered 503 by a relay in front of the gateway's control API, so that step is
retried. The last test walks the registry: a series nobody asserts fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from devstack.background_server import BackgroundServer
from devstack.ports import free_port
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from tests.fixtures.gated_engine import GatedEngine
from tests.fixtures.worker_process import WorkerProcess, one_host_args
from tests.unit.test_grafana_dashboard import dashboard_series
from workers.fleet_interceptor import FleetInterceptor
from workers.fleet_metrics import FleetMetrics
from workers.local_stack import InProcessGateway, start_gateway
from workflows.rollout import RolloutWorkflow

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]

QUEUE = "metrics-tests"
SAMPLES = 3  # rollouts per task: together more than the host's two sandboxes

#: Series this module asserts (family names, as the registry has them).
ASSERTED_HERE = {
    "rollout_worker_rollouts_started",
    "rollout_worker_rollouts_finished",
    "rollout_worker_step_seconds",
    "rollout_worker_step_retries",
    "rollout_worker_step_failures",
    "rollout_worker_reward",
    "rollout_worker_images",
    "rollout_worker_sandboxes_live",
    "rollout_worker_sandboxes_warm",
    "rollout_worker_task_queue_backlog",
    "rollout_worker_task_queue_backlog_age_seconds",
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=30).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_series(text: str) -> set[str]:
    """Every series name an exposition offers, also of labelled families with no child yet
    (a counter nothing has moved still names `<family>_total`)."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over every sample of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


class FailFirstSessionCreate:
    """A relay in front of the gateway's control API that answers the first
    `POST /sessions` with 503 (a gateway that is briefly overloaded) and forwards the rest."""

    def __init__(self, control_url: str) -> None:
        self.control_url = control_url.rstrip("/")
        self.failed = 0

    def app(self) -> Starlette:
        async def relay(request: Request) -> Response:
            if request.method == "POST" and request.url.path == "/sessions" and not self.failed:
                self.failed += 1
                return Response(b'{"error": "overloaded for the test"}', status_code=503)
            async with httpx.AsyncClient(timeout=120) as client:
                reply = await client.request(
                    request.method,
                    f"{self.control_url}{request.url.path}",
                    params=request.query_params,
                    content=await request.body(),
                    headers={k: v for k, v in request.headers.items() if k != "host"},
                )
            headers = {k: v for k, v in reply.headers.items() if k == "content-type"}
            return Response(reply.content, reply.status_code, headers=headers)

        methods = ["GET", "POST", "DELETE", "PUT"]
        return Starlette(routes=[Route("/{path:path}", relay, methods=methods)])


def scraped_when(url: str, check: Any) -> Any:
    """A condition for `wait_for`: a scrape of `url` once `check(scrape)` holds."""

    def cond() -> Samples | None:
        samples = scrape(url)
        return samples if check(samples) else None

    return cond


def wait_for(cond: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = cond()
        if found:
            return found
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise AssertionError(f"`rollout run` ended before {what}:\n{out[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Fleet:
    url: str
    """The worker's fleet metrics."""
    gated: GatedEngine
    relay: FailFirstSessionCreate
    gateway: InProcessGateway
    work: Path
    temporal: str
    base_image: Any


@pytest.fixture
def fleet(temporal_server: TemporalDevServer, sandbox_base_image: Any) -> Iterator[Fleet]:
    model = ensure_tiny_model()
    engine = ScriptedEngine(
        model / "tokenizer.json",
        Script(rules=[ScriptRule(when_contains="6 times 7", reply="42", repeat=True)]),
    )
    gated = GatedEngine(engine, "6 times 7")  # every call of the held task waits
    # under /tmp: the sandbox uid must traverse the local backend's state dir
    work = Path(tempfile.mkdtemp(prefix="rollout-fleet-", dir="/tmp"))
    work.chmod(0o755)
    with contextlib.ExitStack() as cleanup:  # torn down in reverse
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        engine_server = cleanup.enter_context(BackgroundServer(gated))
        gateway = start_gateway(engine_server.url, model, work / "gateway", "tiny")
        cleanup.callback(gateway.stop)
        relay = FailFirstSessionCreate(gateway.control_url)
        relay_server = cleanup.enter_context(BackgroundServer(relay.app()))
        port = free_port()
        worker = WorkerProcess(
            one_host_args(
                temporal_server.address,
                QUEUE,
                "metrics-host",
                relay_server.url,
                gateway.admin_token,
                work,
                f"--metrics-port={port}",
                "--metrics-interval-s=0.2",
                "--warm-pool-size=1",
                "--max-sandboxes=2",
            ),
            work / "worker.log",
            dict(os.environ),
        )
        cleanup.callback(worker.stop)
        cleanup.callback(gated.release)  # first: a held call must not hold the teardown
        worker.start()
        yield Fleet(
            f"http://127.0.0.1:{port}/metrics",
            gated,
            relay,
            gateway,
            work,
            temporal_server.address,
            sandbox_base_image,
        )


def test_a_batch_moves_every_series(fleet: Fleet) -> None:
    """Two tasks of 3 rollouts, one on the base image by name (its rootfs found), every
    agent call held at the engine and room for 2 sandboxes: while held, two sandboxes
    are live, a blank is warm and the other provisions wait in the sandbox queue's
    backlog. Released, every rollout ends ok with reward 1, and each step, the retried
    session create, the image and the rewards are counted.
    Replaying the same histories with the same interceptor then counts nothing (the live
    counts above are its control: that interceptor does count when not replaying)."""
    url, work = fleet.url, fleet.work
    before = scrape(url)
    prompt = "What is 6 times 7? Reply with the number only."
    named_image = make_task("named-image", prompt, "42", turns=1)
    named_image["sandbox"]["image"] = fleet.base_image.tag
    tasks = [make_task("plain", prompt, "42", turns=1), named_image]
    tasks_file = work / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.run_cmd",
            str(tasks_file),
            f"--temporal={fleet.temporal}",
            f"--task-queue={QUEUE}",
            f"--out={work / 'samples'}",
            f"--samples-per-task={SAMPLES}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    try:
        held = wait_for(
            scraped_when(
                url,
                lambda s: (
                    value(s, "rollout_worker_sandboxes_live", backend="local") == 2
                    and value(s, "rollout_worker_sandboxes_warm", backend="local") >= 1
                    and total(s, "rollout_worker_task_queue_backlog", task_queue=f"{QUEUE}-sandbox")
                    >= 1
                ),
            ),
            300,
            "two live sandboxes, a warm blank and a waiting provision",
            run,
        )
        fleet.gated.release()
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out.decode(errors="replace")[-3000:]
    rollouts = 2 * SAMPLES
    after = wait_for(
        scraped_when(
            url,
            lambda s: (
                value(s, "rollout_worker_sandboxes_live", backend="local") == 0
                and total(s, "rollout_worker_step_seconds_count", step="destroy")
                - total(before, "rollout_worker_step_seconds_count", step="destroy")
                == rollouts
            ),
        ),
        120,
        "every sandbox destroyed",
        run,
    )

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert moved("rollout_worker_rollouts_started_total", harness="command") == rollouts
    assert moved("rollout_worker_rollouts_finished_total", status="ok") == rollouts
    assert moved("rollout_worker_rollouts_finished_total") == rollouts
    # each step once per rollout (create_session twice for the one that was refused)
    for step in ("provision", "run_harness", "collect", "destroy", "agent", "hook:evaluate"):
        assert moved("rollout_worker_step_seconds_count", step=step) == rollouts, step
    assert moved("rollout_worker_step_seconds_count", step="create_session") == rollouts + 1
    assert moved("rollout_worker_step_seconds_sum", step="agent") > 0
    assert moved("rollout_worker_step_retries_total", step="create_session") == 1
    assert moved("rollout_worker_step_retries_total") == 1
    assert moved("rollout_worker_step_failures_total", step="create_session") == 1
    assert moved("rollout_worker_step_failures_total") == 1
    assert fleet.relay.failed == 1
    # rewards: all 1, of the JSONL dataset
    assert moved("rollout_worker_reward_count", dataset="jsonl") == rollouts
    assert moved("rollout_worker_reward_sum", dataset="jsonl") == rollouts
    assert moved("rollout_worker_reward_bucket", dataset="jsonl", le="0.9") == 0
    # the named image's rootfs was there already, once per rollout of that task
    assert moved("rollout_worker_images_total", kind="rootfs", result="cached") == SAMPLES
    assert moved("rollout_worker_images_total") == SAMPLES
    # while held (live sandboxes and the warm blank: the wait above), the provisions
    # waiting for room were the sandbox queue's activity backlog
    queue = {"task_queue": f"{QUEUE}-sandbox", "kind": "activity"}
    assert value(held, "rollout_worker_task_queue_backlog", **queue) >= 1
    assert value(held, "rollout_worker_task_queue_backlog_age_seconds", **queue) > 0
    # every series the shipped dashboard reads is one of these two processes' own
    gw = fleet.gateway
    text = httpx.get(f"{gw.control_url}/metrics", headers=gw.admin_headers, timeout=30).text
    worker_text = httpx.get(fleet.url, timeout=30).text
    exported = exported_series(text) | exported_series(worker_text)
    assert dashboard_series() - exported == set(), "dashboard series nobody exports"
    # a replay of these histories (a restarted worker, a cache eviction) counts nothing
    replayed = asyncio.run(replay_batch(fleet.temporal, rollouts))
    counted = [f.name for f in replayed.registry.collect() if f.samples]
    assert counted == []


async def replay_batch(temporal: str, expected: int) -> FleetMetrics:
    """Replay every rollout history of the test's queue (`expected` of them) with the fleet
    interceptor on a fresh registry."""
    client = await Client.connect(temporal, data_converter=pydantic_data_converter)
    query = f"WorkflowType = 'RolloutWorkflow' AND TaskQueue = '{QUEUE}'"
    histories = [h async for h in client.list_workflows(query).map_histories()]
    assert len(histories) == expected
    metrics = FleetMetrics()
    replayer = Replayer(
        workflows=[RolloutWorkflow],
        interceptors=[FleetInterceptor(metrics)],
        data_converter=pydantic_data_converter,
    )

    async def each() -> AsyncIterator[WorkflowHistory]:
        for history in histories:
            yield history

    results = await replayer.replay_workflows(each(), raise_on_replay_failure=False)
    assert not results.replay_failures, results.replay_failures
    return metrics


def test_every_registered_series_is_asserted() -> None:
    """The worker's registry against the series asserted above: a new series that no test
    asserts fails here, and so does an asserted one that is gone."""
    registered = {family.name for family in FleetMetrics().registry.collect()}
    assert registered == ASSERTED_HERE
