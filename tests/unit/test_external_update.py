"""External policy updates (`POST /policy/hold` and `/policy/release`) where the
integration tests do not go: the bodies' rules, a peer whose coordinator goes quiet
during a trainer's sync, holds that cannot pause or drain. The engines are HTTP fakes
of vLLM's weight endpoints (`FakeVllmDevEndpointsForTests`); the updater, the gate, the
hold and the history file are the real ones."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from devstack.background_server import BackgroundServer
from gateway.errors import GatewayError
from gateway.policy.external_sync import ExternalSync
from gateway.policy.update import PolicyGate, PolicyUpdater
from schemas.policy import (
    UNKNOWN_WEIGHTS,
    PeerPause,
    PolicyHold,
    PolicyRelease,
    PolicyUpdateRecord,
)
from tests.fixtures.clock import ManualClock
from tests.fixtures.weight_endpoints import FakeVllmDevEndpointsForTests


@pytest.fixture
def engine() -> Iterator[tuple[FakeVllmDevEndpointsForTests, str]]:
    fake = FakeVllmDevEndpointsForTests()
    with BackgroundServer(fake.app()) as server:
        yield fake, server.url


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({"update_id": "u1"}, None, "give policy_version"),
        ({"update_id": "u1", "policy_version": "unknown"}, "policy_version", "reserved"),
        ({"update_id": "u1", "error": ""}, "error", "at least 1 character"),
        ({"update_id": "a/b", "policy_version": "v"}, "update_id", "pattern"),
        ({"update_id": "u1", "policy_version": "v", "extra": 1}, "extra", "not permitted"),
    ],
)
def test_a_release_names_a_version_or_an_error(
    body: dict[str, object], field: str | None, text: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        PolicyRelease.model_validate(body)
    [error] = refused.value.errors()
    assert (error["loc"][0] if error["loc"] else None) == field
    assert text in error["msg"]


def test_release_outcomes_and_hold_bounds() -> None:
    failed = PolicyRelease(update_id="u1", error="rank 3 died")
    assert (failed.policy_version, failed.touched) == (None, True)
    assert PolicyRelease(update_id="u1", policy_version="v2").error is None
    assert PolicyHold(update_id="u1").lease_s == 600.0
    for bad in ({"lease_s": 0}, {"lease_s": 7201}, {"drain_timeout_s": 0}):
        with pytest.raises(ValidationError):
            PolicyHold.model_validate({"update_id": "u1", **bad})
    with pytest.raises(ValidationError, match="reserved"):
        PolicyHold(update_id="u1", policy_version=UNKNOWN_WEIGHTS)


def test_history_entries_written_before_external_updates_read_as_checkpoint_updates() -> None:
    old = PolicyUpdateRecord.model_validate_json(
        '{"update_id": "a", "policy_version": "v1", "checkpoint": "/c", "previous_version":'
        ' null, "status": "ok", "started_at": "2026-01-01T00:00:00Z", "processes": 1,'
        ' "drained_calls": 0, "held_calls": 0, "drain_s": 0, "load_s": 0, "total_s": 0}'
    )
    assert (old.kind, old.checkpoint) == ("checkpoint", "/c")


def test_a_peer_held_for_a_quiet_trainer_labels_its_engine_unknown(
    engine: tuple[FakeVllmDevEndpointsForTests, str], tmp_path: Path
) -> None:
    """A process paused for an external hold whose coordinator went quiet: when its lease
    runs out it labels the engine `unknown`, even though the engine reports the version
    the hold announced (a trainer's sync may set the version before it has moved every
    weight, and nothing here can tell). A release sent to it names where to send it."""
    fake, url = engine
    fake.version = "v-ext"
    clock = ManualClock()

    async def run() -> None:
        peer = PolicyUpdater(PolicyGate(), [url], tmp_path / "gw", sleep=clock.sleep)
        pause = PeerPause(update_id="h1", lease_s=0.05, policy_version="v-ext", external=True)
        await peer.pause_for_peer(pause)
        with pytest.raises(GatewayError, match="on the control URL that took the hold"):
            await ExternalSync(peer).release(PolicyRelease(update_id="h1", policy_version="v"))
        await clock.until_pending(0.05)
        assert peer.gate.closed
        clock.advance(0.05)
        async with peer.gate.admitted():  # waits for the lease to open the gate
            pass
        assert peer.gate.version_on(url) == UNKNOWN_WEIGHTS

    asyncio.run(run())


def test_a_hold_that_cannot_pause_or_drain_leaves_everything_as_it_was(
    engine: tuple[FakeVllmDevEndpointsForTests, str], tmp_path: Path
) -> None:
    """A peer that cannot be reached (503), and calls that outlast the drain (409): the
    hold fails with an error that says what the engines serve, the gate is open, the
    lock free for the next hold, and the history records each failure."""
    _, url = engine

    async def run() -> None:
        lonely = PolicyUpdater(
            PolicyGate("v1"), [url], tmp_path / "a", peers=["http://127.0.0.1:9"]
        )
        with pytest.raises(GatewayError) as unreachable:
            await ExternalSync(lonely).hold(PolicyHold(update_id="h1"))
        assert (unreachable.value.status, unreachable.value.kind) == (503, "engine_unavailable")
        assert unreachable.value.message.startswith("external update h1 could not hold")
        assert unreachable.value.message.endswith("every engine serves v1")
        assert not lonely.gate.closed and not lonely.state().updating

        updater = PolicyUpdater(PolicyGate("v1"), [url], tmp_path / "b")
        sync = ExternalSync(updater)
        running, finish = asyncio.Event(), asyncio.Event()

        async def call() -> None:
            async with updater.gate.admitted(url):
                running.set()
                await finish.wait()  # outlasts the drain: it ends when the test says

        busy = asyncio.create_task(call())
        await running.wait()
        with pytest.raises(GatewayError, match=r"1 engine call\(s\) still running") as slow:
            await sync.hold(PolicyHold(update_id="h2", drain_timeout_s=0.05))
        assert slow.value.status == 409
        assert not updater.gate.closed and updater.state().held_for is None
        finish.set()
        await busy
        held = await sync.hold(PolicyHold(update_id="h3"))
        assert (held.drained_calls, held.previous_version) == (0, "v1")
        await sync.release(PolicyRelease(update_id="h3", policy_version="v2"))
        assert [(r.update_id, r.status) for r in updater.history()] == [
            ("h2", "failed"),
            ("h3", "ok"),
        ]
        assert [(r.update_id, r.status) for r in lonely.history()] == [("h1", "failed")]

    asyncio.run(run())
