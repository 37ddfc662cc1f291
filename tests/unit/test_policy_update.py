"""Policy updates where vLLM CPU cannot go: several engines, a load that fails in the
middle, peers that refuse or go quiet, a cancelled update, a damaged history. The
engines are HTTP fakes of vLLM's weight endpoints (`FakeVllmDevEndpointsForTests`); the
updater, its loader, the gate, the history file and the checkpoints are the real ones,
over real HTTP and real files."""

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devstack.background_server import BackgroundServer
from gateway.engines.vllm_weights import VllmWeightLoader
from gateway.errors import GatewayError
from gateway.policy.external_sync import ExternalSync
from gateway.policy.history import HISTORY_FILE
from gateway.policy.update import PolicyGate, PolicyUpdater, Sleep
from schemas.policy import (
    UNKNOWN_WEIGHTS,
    PeerPause,
    PeerResume,
    PolicyHold,
    PolicyRelease,
    PolicyUpdate,
    WeightUpdate,
    WeightUpdateReport,
)
from tests.fixtures.clock import ManualClock
from tests.fixtures.weight_endpoints import (
    FakeVllmDevEndpointsForTests,
    bad_header,
    make_checkpoint,
    truncated,
)


@pytest.fixture
def engines() -> Iterator[tuple[list[FakeVllmDevEndpointsForTests], list[str]]]:
    fakes = [FakeVllmDevEndpointsForTests(), FakeVllmDevEndpointsForTests()]
    with BackgroundServer(fakes[0].app()) as one, BackgroundServer(fakes[1].app()) as two:
        yield fakes, [one.url, two.url]
        for fake in fakes:
            fake.hold.set()


def updater_for(urls: list[str], tmp_path: Path, **kwargs: object) -> PolicyUpdater:
    kwargs.setdefault("checkpoint_roots", [tmp_path])
    return PolicyUpdater(PolicyGate(), urls, tmp_path / "gw", **kwargs)  # type: ignore[arg-type]


async def failed(updater: PolicyUpdater, version: str, checkpoint: str) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await updater.update(PolicyUpdate(policy_version=version, checkpoint=checkpoint))
    return caught.value


def test_engines_that_loaded_go_back_when_another_fails_mid_load(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """Two engines on v-old; the update to v-new: engine 1 loads it, engine 2 fails in
    the middle of its reload (its weights are then not known). Both are put back on
    v-old's checkpoint, both resumed, the gate open, every call labelled v-old, and the
    history records the failure with what each engine serves."""
    (first, second), (one, two) = engines
    old, new = make_checkpoint(tmp_path / "old"), make_checkpoint(tmp_path / "new", 2.0)
    updater = updater_for([one, two], tmp_path)

    async def run() -> GatewayError:
        await updater.update(PolicyUpdate(policy_version="v-old", checkpoint=old))
        second.fail_reloads = 1
        return await failed(updater, "v-new", new)

    error = asyncio.run(run())
    assert (error.status, error.kind) == (502, "engine_bad_reply")
    assert f"engine {two} did not load {new}" in error.message
    assert error.message.endswith("every engine serves v-old")
    assert (first.version, first.checkpoint, first.paused) == ("v-old", old, False)
    assert (second.version, second.checkpoint, second.paused) == ("v-old", old, False)
    gate = updater.gate
    assert (gate.version, gate.closed, gate.version_on(one), gate.version_on(two)) == (
        "v-old", False, "v-old", "v-old",
    )  # fmt: skip
    history = updater.history()
    assert [(r.policy_version, r.status) for r in history] == [("v-old", "ok"), ("v-new", "failed")]
    assert history[1].error == error.message
    assert [e.engine for e in history[1].engines] == [one]
    assert [(s.engine, s.policy_version) for s in history[1].serving] == [
        (one, "v-old"),
        (two, "v-old"),
    ]


def test_engines_left_on_different_weights_label_their_calls_with_what_each_serves(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """The first update ever (no earlier checkpoint to go back to): engine 1 loads v1,
    engine 2 fails mid-reload. Engine 1's calls are labelled v1, engine 2's `unknown`
    (a label that names no policy), the process-wide version is None, the error says
    what each engine serves, and a restarted process knows the same."""
    (first, second), (one, two) = engines
    second.fail_reloads = 1
    ckpt = make_checkpoint(tmp_path / "v1")
    updater = updater_for([one, two], tmp_path)
    error = asyncio.run(failed(updater, "v1", ckpt))
    assert error.status == 502
    assert error.message.endswith(f"engines serve: {one} v1, {two} {UNKNOWN_WEIGHTS}")
    assert f"{one} keeps v1: no earlier checkpoint known" in error.message
    for gate in (updater.gate, updater_for([one, two], tmp_path).gate):  # and restarted
        assert (gate.version, gate.closed) == (None, False)
        assert (gate.version_on(one), gate.version_on(two)) == ("v1", UNKNOWN_WEIGHTS)
    state = updater.state()
    assert (state.policy_version, state.checkpoint) == (None, None)
    assert [(e.engine, e.policy_version, e.checkpoint) for e in state.engines] == [
        (one, "v1", ckpt),
        (two, UNKNOWN_WEIGHTS, None),
    ]
    assert (first.paused, second.paused) == (False, False)

    async def admitted_on(url: str) -> str | None:
        async with updater.gate.admitted(url) as version:
            return version

    assert asyncio.run(admitted_on(one)) == "v1"
    assert asyncio.run(admitted_on(two)) == UNKNOWN_WEIGHTS
    # the next good update puts every engine on one version again
    ckpt2 = make_checkpoint(tmp_path / "v2")
    asyncio.run(updater.update(PolicyUpdate(policy_version="v2", checkpoint=ckpt2)))
    assert (updater.gate.version, updater.gate.version_on(two)) == ("v2", "v2")


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        pytest.param(truncated, "truncated or padded", id="truncated"),
        pytest.param(lambda _good, where: bad_header(where), "unreadable safetensors header",
                     id="bad-header"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_breaks_between_check_and_load_fails_the_update_cleanly(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]],
    tmp_path: Path,
    damage: Callable[[str, Path], str],
    says: str,
) -> None:
    """The checkpoint passes the checks before the pause, then its weights file is cut
    short, or its header garbled, before the engine's loader reads it (the loader checks
    again): the engine is never touched, the update answers 502 naming the problem, the
    old version serves and the history has the failure."""
    (first, _), (one, _) = engines
    good = make_checkpoint(tmp_path / "good")
    later = make_checkpoint(tmp_path / "later", 3.0)

    def cutting_loader(url: str) -> VllmWeightLoader:
        class CutsFirst(VllmWeightLoader):
            async def load(self, update: WeightUpdate) -> WeightUpdateReport:
                if update.checkpoint == later:
                    damaged = Path(damage(good, tmp_path / "cut"))
                    os.replace(damaged / "model.safetensors", Path(later) / "model.safetensors")
                return await super().load(update)

        return CutsFirst(url)

    updater = updater_for([one], tmp_path, loader=cutting_loader)

    async def run() -> GatewayError:
        await updater.update(PolicyUpdate(policy_version="v1", checkpoint=good))
        return await failed(updater, "v2", later)

    error = asyncio.run(run())
    assert error.status == 502 and says in error.message
    assert error.message.endswith("every engine serves v1")
    assert first.calls.count("/collective_rpc") == 1  # v1's only
    assert (first.version, updater.gate.version, updater.gate.closed) == ("v1", "v1", False)
    assert [r.status for r in updater.history()] == ["ok", "failed"]


def test_bad_checkpoints_are_refused_before_anything_pauses(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """A truncated weights file, an unparsable header, a path outside the roots (also
    through a symlink, and a checkpoint whose file links outside), and no root at all:
    each a precise error naming the checkpoint (the roots for a 403), nothing paused,
    nothing recorded. The control: a good checkpoint under the root loads."""
    (first, _), (one, _) = engines
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    good = make_checkpoint(root / "good")
    outside = make_checkpoint(elsewhere / "ckpt")
    (root / "link").symlink_to(elsewhere / "ckpt")
    leaky = make_checkpoint(root / "leaky")
    os.remove(Path(leaky) / "model.safetensors")
    (Path(leaky) / "model.safetensors").symlink_to(Path(outside) / "model.safetensors")
    updater = updater_for([one], tmp_path, checkpoint_roots=[root])
    cases = [
        (truncated(good, root / "cut"), 400, "truncated or padded"),
        (bad_header(root / "junk"), 400, "unreadable safetensors header"),
        (outside, 403, f"is not under a checkpoint root ({root})"),
        (str(root / "link"), 403, f"is not under a checkpoint root ({root})"),
        (str(elsewhere / "missing"), 403, "is not under a checkpoint root"),
        (leaky, 403, "model.safetensors links outside the checkpoint roots"),
        (str(root / "missing"), 404, "does not exist"),
    ]
    for checkpoint, status, text in cases:
        error = asyncio.run(failed(updater, "v1", checkpoint))
        assert (error.status, error.param if status != 404 else "checkpoint") == (
            status, "checkpoint",
        ), (checkpoint, error.message)  # fmt: skip
        assert text in error.message, (checkpoint, error.message)
    no_roots = updater_for([one], tmp_path, checkpoint_roots=[])
    error = asyncio.run(failed(no_roots, "v1", good))
    assert error.status == 403 and "--checkpoint-root" in error.message
    assert first.calls == [] and updater.history() == [] and not updater.gate.closed
    asyncio.run(updater.update(PolicyUpdate(policy_version="v1", checkpoint=good)))
    assert first.version == "v1"


def test_a_restarted_gateway_serves_the_last_applied_version(tmp_path: Path) -> None:
    engine = FakeVllmDevEndpointsForTests()
    ckpt = make_checkpoint(tmp_path / "ckpt")
    with BackgroundServer(engine.app()) as server:
        updater = updater_for([server.url], tmp_path)
        asyncio.run(updater.update(PolicyUpdate(policy_version="v7", checkpoint=ckpt)))
    again = updater_for([server.url], tmp_path)
    assert (again.gate.version, again.checkpoint) == ("v7", ckpt)


def test_a_torn_last_history_line_is_dropped_at_start_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash mid-write leaves a last line without its newline: the next start drops it
    (and logs it), serves the version of the last whole entry, and appends after it."""
    engine = FakeVllmDevEndpointsForTests()
    ckpt, ckpt2 = make_checkpoint(tmp_path / "a"), make_checkpoint(tmp_path / "b")
    path = tmp_path / "gw" / HISTORY_FILE
    with BackgroundServer(engine.app()) as server:
        asyncio.run(
            updater_for([server.url], tmp_path).update(
                PolicyUpdate(policy_version="v1", checkpoint=ckpt)
            )
        )
        whole = path.read_bytes()
        path.write_bytes(whole + b'{"update_id": "u2", "policy_version": "v2", "che')
        with caplog.at_level(logging.WARNING, "rollout.gateway"):
            restarted = updater_for([server.url], tmp_path)
        assert "dropped a torn last line of" in caplog.text
        assert path.read_bytes() == whole
        assert restarted.gate.version == "v1"
        asyncio.run(restarted.update(PolicyUpdate(policy_version="v2", checkpoint=ckpt2)))
    assert [r.policy_version for r in restarted.history()] == ["v1", "v2"]


def test_history_entries_are_fsynced_with_the_directory_on_creation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry is fsynced before the update answers; creating the file fsyncs its
    directory too (so the entry survives a power loss)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def spying_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spying_fsync)
    engine = FakeVllmDevEndpointsForTests()
    a, b = make_checkpoint(tmp_path / "a"), make_checkpoint(tmp_path / "b")
    with BackgroundServer(engine.app()) as server:
        updater = updater_for([server.url], tmp_path)
        asyncio.run(updater.update(PolicyUpdate(policy_version="v1", checkpoint=a)))
        history, directory = str(updater.history_path), str(updater.history_path.parent)
        assert synced == [history, directory]
        asyncio.run(updater.update(PolicyUpdate(policy_version="v2", checkpoint=b)))
    assert synced == [history, directory, history]


class PeerForTests:
    """A second gateway process's policy endpoints (the real `PolicyUpdater` peer code
    behind HTTP); `refuse` answers every pause with that status instead."""

    def __init__(
        self,
        urls: list[str],
        data_dir: Path,
        refuse: int | None = None,
        delay_s: float = 0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.updater = PolicyUpdater(PolicyGate(), urls, data_dir, sleep=sleep)
        self.refuse = refuse
        self.delay_s = delay_s
        self.pauses: list[int] = []
        """The status of each pause this peer answered."""

    def app(self) -> Starlette:
        async def pause(request: Request) -> Response:
            body = PeerPause.model_validate(await request.json())
            if self.refuse is not None:
                return JSONResponse({"error": {"message": "boom"}}, self.refuse)
            await asyncio.sleep(self.delay_s)
            try:
                done = await self.updater.pause_for_peer(body)
            except GatewayError as err:
                self.pauses.append(err.status)
                return JSONResponse({"error": {"message": err.message}}, err.status)
            self.pauses.append(200)
            return Response(done.model_dump_json(), media_type="application/json")

        async def resume(request: Request) -> Response:
            try:
                self.updater.resume_for_peer(PeerResume.model_validate(await request.json()))
            except GatewayError as err:
                return JSONResponse({"error": {"message": err.message}}, err.status)
            return JSONResponse({"resumed": True})

        return Starlette(
            routes=[
                Route("/policy/pause", pause, methods=["POST"]),
                Route("/policy/resume", resume, methods=["POST"]),
            ]
        )


def test_a_peer_that_refuses_or_is_gone_fails_the_update_with_everyone_resumed(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """Peer 1 pauses, peer 2 answers 500: the update fails (409, naming peer 2) before
    any engine is touched, peer 1 is resumed, the coordinator's gate is open, the history
    says so. With a peer nobody listens on: a 503 naming it, same outcome."""
    (first, _), (one, _) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    good = PeerForTests([one], tmp_path / "gw")
    bad = PeerForTests([one], tmp_path / "gw", refuse=500)
    with BackgroundServer(good.app()) as p1, BackgroundServer(bad.app()) as p2:
        updater = updater_for([one], tmp_path, peers=[p1.url, p2.url])

        async def run() -> GatewayError:
            error = await failed(updater, "v1", ckpt)
            assert not good.updater.gate.closed  # resumed
            assert good.updater._peer_hold is None
            return error

        error = asyncio.run(run())
        assert (error.status, error.kind) == (409, "conflict")
        assert f"gateway process {p2.url} refused pause (500)" in error.message
        assert error.message.endswith("every engine serves its starting weights")
        gone = f"http://127.0.0.1:{_closed_port()}"
        updater2 = updater_for([one], tmp_path, peers=[gone])
        error2 = asyncio.run(failed(updater2, "v1", ckpt))
        assert error2.status == 503 and f"gateway process {gone} unreachable" in error2.message
    assert first.calls == []  # no engine touched
    assert [r.status for r in updater.history()] == ["failed", "failed"]
    assert not updater.gate.closed and not updater2.gate.closed


def test_a_peer_that_answers_too_late_is_resumed_and_refuses_its_late_pause(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer does not answer the pause in time: the update fails (503 naming it, no
    engine touched) and the peer is sent the resume all the same; when the pause does
    reach it, it refuses it (the update has ended), so it never stays paused."""
    monkeypatch.setattr("gateway.policy.update.PEER_ANSWER_S", 0.3)
    (first, _), (one, _) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    slow = PeerForTests([one], tmp_path / "gw", delay_s=1.0)
    with BackgroundServer(slow.app()) as p1:
        updater = updater_for([one], tmp_path, peers=[p1.url])
        error = asyncio.run(
            failed_with(
                updater, PolicyUpdate(policy_version="v1", checkpoint=ckpt, drain_timeout_s=0.1)
            )
        )
        assert error.status == 503 and f"{p1.url} unreachable for pause" in error.message
        assert "ReadTimeout" in error.message
        for _ in range(500):
            if slow.pauses:
                break
            time.sleep(0.01)
    assert slow.pauses == [409]
    assert not slow.updater.gate.closed and slow.updater._peer_hold is None
    assert first.calls == [] and [r.status for r in updater.history()] == ["failed"]


async def failed_with(updater: PolicyUpdater, update: PolicyUpdate) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await updater.update(update)
    return caught.value


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_peer_leases_are_renewed_while_a_slow_load_runs(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """The engine's reload takes several lease lengths: the coordinator renews the
    peer's lease every third of it meanwhile, so the peer stays paused (it does not
    label calls with the old version while the weights change) and resumes on the new
    version. The lease timers of both run on one manual clock."""
    (first, _), (one, _) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    clock = ManualClock()
    peer = PeerForTests([one], tmp_path / "gw", sleep=clock.sleep)
    first.hold.clear()
    with BackgroundServer(peer.app()) as p1:
        updater = updater_for([one], tmp_path, peers=[p1.url], lease_s=0.6, sleep=clock.sleep)

        async def run() -> None:
            update = asyncio.create_task(
                updater.update(PolicyUpdate(policy_version="v1", checkpoint=ckpt))
            )
            assert await asyncio.to_thread(first.reloading.wait, 60)
            # the coordinator's next renewal in 0.2 s, the peer's lease out in 0.6 s
            await clock.until_pending(0.2, 0.6)
            for _ in range(9):  # three leases
                clock.advance(0.2)
                await clock.until_pending(0.2, 0.6)  # renewed: the lease starts again
                assert peer.updater.gate.closed
            first.hold.set()
            await update

        asyncio.run(run())
    assert (peer.updater.gate.closed, peer.updater.gate.version) == (False, "v1")
    clock.wait_pending()  # none left: the renewals and the peer's lease ended with it


def test_a_peer_whose_lease_ran_out_takes_the_version_the_engines_serve(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """A peer paused for an update whose coordinator went quiet: when its lease runs out
    it asks each engine; the one that loaded the update's version is labelled with it,
    the other keeps its version. A resume that comes after the lease still sets the
    outcome; a pause for an update that has ended is refused."""
    (first, _), (one, two) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    clock = ManualClock()

    async def run() -> None:
        peer = PolicyUpdater(PolicyGate(), [one, two], tmp_path / "gw", sleep=clock.sleep)
        await peer.pause_for_peer(
            PeerPause(update_id="u1", lease_s=0.05, policy_version="v1", checkpoint=ckpt)
        )
        assert peer.gate.closed and peer.state().updating
        with pytest.raises(GatewayError, match="already in a policy update"):
            await peer.pause_for_peer(PeerPause(update_id="u2"))
        first.version = "v1"  # the coordinator had engine 1 load v1, then went quiet
        await clock.until_pending(0.05)
        clock.advance(0.049)
        await clock.until_pending(0.001)
        assert peer.gate.closed  # control: not before its lease is out
        clock.advance(0.001)
        async with peer.gate.admitted():  # waits for the gate to open
            pass
        assert (peer.gate.version_on(one), peer.gate.version_on(two)) == ("v1", None)
        assert not peer.state().updating
        # the coordinator's resume comes late: taken all the same
        peer.resume_for_peer(PeerResume(update_id="u1", policy_version="v1", checkpoint=ckpt))
        assert (peer.gate.version, peer.checkpoint) == ("v1", ckpt)
        with pytest.raises(GatewayError, match="not paused for update u9"):
            peer.resume_for_peer(PeerResume(update_id="u9", policy_version="v9"))
        with pytest.raises(GatewayError, match="update u9 has already ended"):
            await peer.pause_for_peer(PeerPause(update_id="u9"))
        assert not peer.gate.closed

    asyncio.run(run())


def test_an_update_whose_caller_leaves_still_ends_and_a_cancelled_one_resumes(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """The caller of `POST /policy` goes away mid-load: the update runs to its end (the
    gate reopens on the new version). The update itself cancelled (the gateway stops)
    mid-load: the gate reopens, the engine is resumed, the engine's version is recorded
    as not known, and the history says the update was cancelled."""
    (first, _), (one, _) = engines
    a, b = make_checkpoint(tmp_path / "a"), make_checkpoint(tmp_path / "b")
    updater = updater_for([one], tmp_path)

    async def run() -> None:
        first.hold.clear()
        caller = asyncio.create_task(
            updater.update(PolicyUpdate(policy_version="v1", checkpoint=a))
        )
        while not first.reloading.is_set():
            await asyncio.sleep(0.01)
        caller.cancel()
        first.hold.set()
        [task] = list(updater._tasks)
        await task
        assert (updater.gate.version, updater.gate.closed) == ("v1", False)

        first.hold.clear()
        caller = asyncio.create_task(
            updater.update(PolicyUpdate(policy_version="v2", checkpoint=b))
        )
        while not first.reloading.is_set():
            await asyncio.sleep(0.01)
        [task] = list(updater._tasks)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        first.hold.set()

    asyncio.run(run())
    assert (updater.gate.closed, updater.gate.version) == (False, UNKNOWN_WEIGHTS)
    assert first.paused is False
    last = updater.history()[-1]
    assert (last.policy_version, last.status) == ("v2", "failed")
    assert last.error is not None and "cancelled" in last.error


def test_a_drain_that_times_out_leaves_everything_open_and_is_recorded(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    (first, _), (one, _) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    updater = updater_for([one], tmp_path)

    async def run() -> GatewayError:
        release = asyncio.Event()

        async def running() -> None:
            async with updater.gate.admitted():
                await release.wait()

        call = asyncio.create_task(running())
        await asyncio.sleep(0)
        with pytest.raises(GatewayError) as caught:
            await updater.update(
                PolicyUpdate(policy_version="v1", checkpoint=ckpt, drain_timeout_s=0.05)
            )
        release.set()
        await call
        return caught.value

    error = asyncio.run(run())
    assert error.status == 409 and "1 engine call(s) still running" in error.message
    assert first.calls == [] and not updater.gate.closed
    assert [r.status for r in updater.history()] == ["failed"]


def test_an_unexpected_error_in_a_load_is_a_failed_update_with_engines_put_back(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """A loader that raises something other than `WeightLoadError` (a bug) on engine 2
    after engine 1 loaded v-new: engine 2 counts as touched, both are put back on v-old,
    the answer names the exception, the gate is open and the history has the failure."""
    (first, second), (one, two) = engines
    old, new = make_checkpoint(tmp_path / "old"), make_checkpoint(tmp_path / "new", 2.0)

    def buggy_loader(url: str) -> VllmWeightLoader:
        class Buggy(VllmWeightLoader):
            async def load(self, update: WeightUpdate) -> WeightUpdateReport:
                if url == two and update.checkpoint == new:
                    raise KeyError("weight_map")
                return await super().load(update)

        return Buggy(url)

    updater = updater_for([one, two], tmp_path, loader=buggy_loader)

    async def run() -> GatewayError:
        await updater.update(PolicyUpdate(policy_version="v-old", checkpoint=old))
        return await failed(updater, "v-new", new)

    error = asyncio.run(run())
    assert (error.status, error.kind) == (502, "engine_bad_reply")
    assert f"engine {two} did not load {new}: KeyError('weight_map')" in error.message
    assert error.message.endswith("every engine serves v-old")
    assert [(f.version, f.checkpoint, f.paused) for f in (first, second)] == [
        ("v-old", old, False),
        ("v-old", old, False),
    ]
    assert (updater.gate.version, updater.gate.closed) == ("v-old", False)
    assert [r.status for r in updater.history()] == ["ok", "failed"]


class JunkPeerForTests:
    """A gateway process whose pause answers 200 with a body that is no `PeerPaused` (a
    bug on its side); it keeps the resumes it is sent."""

    def __init__(self) -> None:
        self.resumes: list[dict[str, object]] = []

    def app(self) -> Starlette:
        async def pause(request: Request) -> Response:
            return JSONResponse({"paused": "yes"})

        async def resume(request: Request) -> Response:
            self.resumes.append(await request.json())
            return JSONResponse({"resumed": True})

        return Starlette(
            routes=[
                Route("/policy/pause", pause, methods=["POST"]),
                Route("/policy/resume", resume, methods=["POST"]),
            ]
        )


def test_an_exception_mid_update_resumes_every_process_and_is_recorded(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """Peer 1 pauses; peer 2's answer cannot be read (an exception in the coordinator,
    not a refusal): a 500 that names it, no engine touched, both peers sent the resume
    (peer 1 is open again), the coordinator's gate open, the failure in the history."""
    (first, _), (one, _) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    good, junk = PeerForTests([one], tmp_path / "gw"), JunkPeerForTests()
    with BackgroundServer(good.app()) as p1, BackgroundServer(junk.app()) as p2:
        updater = updater_for([one], tmp_path, peers=[p1.url, p2.url])
        error = asyncio.run(failed(updater, "v1", ckpt))
    assert (error.status, error.kind) == (500, "internal")
    assert "unexpected ValidationError" in error.message
    assert error.message.endswith("every engine serves its starting weights")
    assert first.calls == []
    assert not good.updater.gate.closed and good.updater._peer_hold is None
    assert [r["update_id"] for r in junk.resumes] == [updater.history()[0].update_id]
    assert not updater.gate.closed
    [record] = updater.history()
    assert (record.status, record.error) == ("failed", error.message)


def test_a_history_that_cannot_be_written_still_resumes_everyone_on_what_engines_serve(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engines load v1, then the history entry cannot be written (the disk is full,
    injected at the write: as root no permission makes a file unwritable): the answer is
    a 503 saying v1 serves and that a restarted gateway would not know it; this gate and
    the peer are open on v1, the version the engines really serve."""
    (first, _), (one, _) = engines
    ckpt = make_checkpoint(tmp_path / "ckpt")
    peer = PeerForTests([one], tmp_path / "peer-data")

    def disk_full(self: object, record: object) -> None:
        raise OSError(28, "No space left on device")

    with BackgroundServer(peer.app()) as p1:
        updater = updater_for([one], tmp_path, peers=[p1.url])
        monkeypatch.setattr(type(updater.history_file), "append", disk_full)
        error = asyncio.run(failed(updater, "v1", ckpt))
    assert (error.status, error.kind) == (503, "storage_unavailable")
    assert "every engine serves v1, but its history entry could not be written" in error.message
    assert "No space left on device" in error.message
    assert first.version == "v1" and not first.paused
    assert (updater.gate.version, updater.gate.closed) == ("v1", False)
    assert (peer.updater.gate.version, peer.updater.gate.closed) == ("v1", False)


def test_a_process_killed_mid_update_restarts_with_its_engines_unknown(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """Process A serves v0, then starts the update to v1 and is killed while the engine
    reloads (here: A is left hanging and a new `PolicyUpdater` of A's address starts on
    the same data dir, as the restarted process does). The restarted A labels the engine
    `unknown`, not v0, and the history says why. Controls: process B, started meanwhile,
    has no update of its own in progress and starts on the history's v0; an update that
    ended leaves no mark, so a later restart of A starts on what it loaded."""
    (first, _), (one, _) = engines
    v0, v1 = make_checkpoint(tmp_path / "v0"), make_checkpoint(tmp_path / "v1", 2.0)
    a = updater_for([one], tmp_path, owner="http://a:1")

    async def run() -> None:
        await a.update(PolicyUpdate(policy_version="v0", checkpoint=v0))
        assert a.marker is not None and not a.marker.path.exists()
        first.hold.clear()
        update = asyncio.create_task(a.update(PolicyUpdate(policy_version="v1", checkpoint=v1)))
        while not first.reloading.is_set():
            await asyncio.sleep(0.01)
        b = updater_for([one], tmp_path, owner="http://b:2")
        assert b.gate.version_on(one) == "v0"
        restarted = updater_for([one], tmp_path, owner="http://a:1")
        assert (restarted.gate.version, restarted.gate.version_on(one)) == (
            UNKNOWN_WEIGHTS, UNKNOWN_WEIGHTS,
        )  # fmt: skip
        last = restarted.history()[-1]
        assert (last.policy_version, last.status, last.kind) == ("v1", "failed", "checkpoint")
        assert last.error is not None and "stopped in its middle" in last.error
        assert restarted.marker is not None and not restarted.marker.path.exists()
        first.hold.set()
        await update

    asyncio.run(run())
    again = updater_for([one], tmp_path, owner="http://a:1")
    assert again.gate.version_on(one) == "v1"


def test_a_process_killed_while_holding_for_a_trainers_sync_restarts_with_engines_unknown(
    engines: tuple[list[FakeVllmDevEndpointsForTests], list[str]], tmp_path: Path
) -> None:
    """A hold for the trainer's own weight sync, then the holding process is killed: the
    restarted process cannot know whether the sync ran, so its engines are `unknown`
    (they were labelled v0 before, which the sync may have replaced). A hold released
    before a restart leaves nothing behind (the control)."""
    (_, _), (one, _) = engines
    v0 = make_checkpoint(tmp_path / "v0")
    a = updater_for([one], tmp_path, owner="http://a:1")
    sync = ExternalSync(a)

    async def run() -> None:
        await a.update(PolicyUpdate(policy_version="v0", checkpoint=v0))
        await sync.hold(PolicyHold(update_id="h1", policy_version="v1", drain_timeout_s=5))
        restarted = updater_for([one], tmp_path, owner="http://a:1")
        assert restarted.gate.version_on(one) == UNKNOWN_WEIGHTS
        last = restarted.history()[-1]
        assert (last.update_id, last.kind, last.status) == ("h1", "external", "failed")
        await sync.release(PolicyRelease(update_id="h1", policy_version="v1"))  # cleanup
        c = updater_for([one], tmp_path, owner="http://c:3")
        c_sync = ExternalSync(c)
        await c_sync.hold(PolicyHold(update_id="h2", drain_timeout_s=5))
        await c_sync.release(PolicyRelease(update_id="h2", policy_version="v2"))

    asyncio.run(run())
    assert updater_for([one], tmp_path, owner="http://c:3").gate.version_on(one) == "v2"


def test_the_gate_holds_new_calls_until_running_ones_have_drained() -> None:
    """Order: a call admitted before the update runs on; the gate closes; a new call
    waits (held, not failed); the drain ends only when the running call ends; after
    `open` the held call is admitted with the version set meanwhile."""

    async def run() -> list[str]:
        gate, events = PolicyGate("v1"), []
        release = asyncio.Event()

        async def running() -> None:
            async with gate.admitted() as version:
                events.append(f"running on {version}")
                await release.wait()
            events.append("running done")

        async def later() -> None:
            async with gate.admitted() as version:
                events.append(f"held call on {version}")

        first = asyncio.create_task(running())
        await asyncio.sleep(0)
        drain = asyncio.create_task(gate.close_and_drain(5))
        await asyncio.sleep(0)
        held = asyncio.create_task(later())
        await asyncio.sleep(0.01)
        events.append(f"held={gate.held} drained={drain.done()}")
        release.set()
        drained, _ = await drain
        events.append(f"drained {drained}")
        gate.version = "v2"
        gate.open()
        await asyncio.gather(first, held)
        return events

    assert asyncio.run(run()) == [
        "running on v1",
        "held=1 drained=False",
        "running done",
        "drained 1",
        "held call on v2",
    ]
