"""Public-mode docker sandboxes each get a network of their own (real engine).

Traffic goes only between containers this test creates and to listeners it starts on
this host's bridge addresses: never to any outside address. Each isolation check has a
control: two containers on docker's default bridge (where public sandboxes used to run)
reach each other and the host's listener with the same probe, so the probe would see
reachability.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import NetworkPolicy, SandboxSpec
from sandboxes.network.docker_network import BRIDGE_PREFIX, network_name

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

PORT = 8000
#: Connects once (3 s limit) and says whether it got through; sends nothing.
PROBE = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
        print("CONNECTED")
    except OSError as e:
        print("FAILED", type(e).__name__)
    """
)
#: An HTTP server that says when it listens (so nothing polls for it).
SERVE = (
    "import http.server as h\n"
    f"s = h.HTTPServer(('', {PORT}), h.SimpleHTTPRequestHandler)\n"
    "print('LISTENING', flush=True)\n"
    "s.serve_forever()\n"
)
PUBLIC = NetworkPolicy(mode="public")


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def backend(sandbox_state_dir: Path, sandbox_base_image: Any) -> AsyncIterator[Any]:
    from sandboxes.backends.docker import DockerBackend

    b = DockerBackend(
        state_dir=sandbox_state_dir / f"pubnet-{uuid.uuid4().hex[:6]}",
        image=sandbox_base_image.tag,
        allow_public_network=True,
    )
    yield b
    for h in await b.list():
        await b.destroy(h)
    await b.close()


class HostListener:
    """A TCP listener on one of this host's addresses that counts connections."""

    def __init__(self, address: str) -> None:
        self.accepted: queue.Queue[str] = queue.Queue()
        self.sock = socket.create_server((address, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.accepted.put(peer[0])
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _network_of(client: Any, cid: str) -> dict[str, Any]:
    (net,) = client.api.inspect_container(cid)["NetworkSettings"]["Networks"].values()
    return dict(net)


def container_ip(client: Any, cid: str) -> str:
    return str(_network_of(client, cid)["IPAddress"])


def gateway_ip(client: Any, cid: str) -> str:
    """This host's address on the container's network (its default route's next hop)."""
    return str(_network_of(client, cid)["Gateway"])


async def probe(sb: Any, address: str, port: int) -> str:
    r = await sb.exec(["python3", "-c", PROBE, address, str(port)], timeout=30)
    assert r.exit_code == 0, r
    return r.stdout.strip()


async def serving(sb: Any) -> asyncio.Task[Any]:
    """`SERVE` in the sandbox, running until the returned task is cancelled."""
    listening = asyncio.Event()

    def seen(chunk: Any) -> None:
        if b"LISTENING" in chunk.data:
            listening.set()

    task = asyncio.create_task(sb.exec(["python3", "-c", SERVE], timeout=120, on_output=seen))
    waiter = asyncio.create_task(listening.wait())
    await asyncio.wait({task, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if not listening.is_set():
        task.cancel()
        waiter.cancel()
        raise AssertionError(f"the sandbox's server never listened: {task}")
    return task


@pytest.fixture
def default_bridge_pair(sandbox_base_image: Any) -> Iterator[tuple[Any, Any]]:
    """The control: a server and a client container on docker's default bridge."""
    import docker

    client = docker.from_env()
    made = []
    try:
        server = client.containers.run(
            sandbox_base_image.tag,
            ["python3", "-u", "-c", SERVE],
            detach=True,
            network_mode="bridge",
            user="1000:1000",
            entrypoint=[],
        )
        made.append(server)
        for line in server.logs(stream=True, follow=True):
            if b"LISTENING" in line:
                break
        peer = client.containers.run(
            sandbox_base_image.tag,
            ["sleep", "300"],
            detach=True,
            network_mode="bridge",
            user="1000:1000",
            entrypoint=[],
        )
        made.append(peer)
        yield server, peer
    finally:
        for c in made:
            c.remove(force=True)


def control_probe(peer: Any, address: str, port: int) -> str:
    return str(peer.exec_run(["python3", "-c", PROBE, address, str(port)]).output.decode()).strip()


async def test_public_sandboxes_cannot_reach_each_other(
    backend: Any, default_bridge_pair: tuple[Any, Any]
) -> None:
    a = await backend.create(SandboxSpec(rollout_id=rid(), network=PUBLIC))
    b = await backend.create(SandboxSpec(rollout_id=rid(), network=PUBLIC))
    server = await serving(a)
    try:
        client = backend.client
        a_ip = container_ip(client, a.handle.details["container_id"])
        b_net = client.api.inspect_container(b.handle.details["container_id"])
        assert list(b_net["NetworkSettings"]["Networks"]) == [network_name(b.handle.sandbox_id)]
        assert (await probe(b, a_ip, PORT)).startswith("FAILED")
        # Control: the same probe between two containers on the default bridge.
        server_c, peer_c = default_bridge_pair
        server_c.reload()
        assert control_probe(peer_c, container_ip(client, server_c.id), PORT) == "CONNECTED"
    finally:
        server.cancel()
        await a.destroy()
        await b.destroy()


async def test_public_sandbox_cannot_reach_the_hosts_services(
    backend: Any, default_bridge_pair: tuple[Any, Any]
) -> None:
    """A listener on the default bridge's host address and one on the sandbox network's
    own gateway address: the sandbox reaches neither; the default-bridge container (the
    control) reaches the first, and the host itself the second."""
    sb = await backend.create(SandboxSpec(rollout_id=rid(), network=PUBLIC))
    client = backend.client
    _, peer_c = default_bridge_pair
    docker0 = HostListener(gateway_ip(client, peer_c.id))
    own = HostListener(gateway_ip(client, sb.handle.details["container_id"]))
    try:
        routes = await sb.exec(["ip", "route"])
        assert routes.stdout.startswith("default via"), routes  # it has a way out
        for listener in (docker0, own):
            address = listener.sock.getsockname()[0]
            assert (await probe(sb, address, listener.port)).startswith("FAILED")
        assert docker0.accepted.empty() and own.accepted.empty()
        assert control_probe(peer_c, docker0.sock.getsockname()[0], docker0.port) == "CONNECTED"
        assert docker0.accepted.get(timeout=10) == container_ip(client, peer_c.id)
        socket.create_connection(own.sock.getsockname(), timeout=5).close()
        own.accepted.get(timeout=10)  # the listener was up: the host's own connection came
    finally:
        docker0.close()
        own.close()
        await sb.destroy()


async def test_a_public_sandboxs_network_goes_with_it(backend: Any) -> None:
    import docker.errors

    sb = await backend.create(SandboxSpec(rollout_id=rid(), network=PUBLIC))
    name = network_name(sb.handle.sandbox_id)
    net = backend.client.api.inspect_network(name)
    assert net["Options"]["com.docker.network.bridge.name"].startswith(BRIDGE_PREFIX)
    await sb.destroy()
    with pytest.raises(docker.errors.NotFound):
        backend.client.api.inspect_network(name)
    # A no-network sandbox makes none.
    off = await backend.create(SandboxSpec(rollout_id=rid()))
    try:
        attrs = backend.client.api.inspect_container(off.handle.details["container_id"])
        assert attrs["HostConfig"]["NetworkMode"] == "none"
    finally:
        await off.destroy()


CRASHING_WORKER = """
import asyncio, sys
from sandboxes.base import NetworkPolicy, SandboxSpec
from sandboxes.backends.docker import DockerBackend

async def main():
    b = DockerBackend(state_dir=sys.argv[1], image=sys.argv[2], allow_public_network=True)
    for rollout in sys.argv[3:]:
        sb = await b.create(SandboxSpec(rollout_id=rollout, network=NetworkPolicy(mode="public")))
        print(sb.handle.sandbox_id, sb.handle.details["container_id"], flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_the_reaper_removes_the_networks_a_crashed_worker_left(
    sandbox_state_dir: Path, sandbox_base_image: Any
) -> None:
    """A worker SIGKILLed with two public sandboxes: one left whole (container, state dir,
    network), one of which only the network is left (as if the crash came between
    removing its container and its network). A later reaper on the same state dir
    removes both networks."""
    import docker.errors

    from sandboxes.backends.docker import DockerBackend
    from sandboxes.host.state import remove_tree

    state = sandbox_state_dir / f"crash-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WORKER, str(state), sandbox_base_image.tag, rid(), rid()],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    made = [proc.stdout.readline().split() for _ in range(2)]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert all(len(m) == 2 for m in made), made
    (whole, _), (bare, bare_cid) = made
    b = DockerBackend(state_dir=state, image=sandbox_base_image.tag)
    try:
        b.client.api.remove_container(bare_cid, force=True)
        remove_tree(state / bare)
        for sid in (whole, bare):
            b.client.api.inspect_network(network_name(sid))  # both left behind
        reaped = await b.reap(set())
        assert sorted(reaped) == sorted([whole, bare])
        for sid in (whole, bare):
            with pytest.raises(docker.errors.NotFound):
                b.client.api.inspect_network(network_name(sid))
        assert await b.list() == []
    finally:
        for h in await b.list():
            await b.destroy(h)
        await b.close()
