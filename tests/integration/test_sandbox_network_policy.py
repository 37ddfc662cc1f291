"""A task's network policy on the real runtimes (bubblewrap, docker engine).

Traffic goes only to servers this test starts on host loopback: the allowlisted name
`allowed.test` is pinned by the operator option `egress_hosts` to 127.0.0.1, so the
host-side relay never asks a resolver. `public` is checked by inspecting the
container's network settings, never by connecting anywhere.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import GatewayChannel, NetworkPolicy, NetworkPolicyRefused, SandboxSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

NAME = "allowed.test"


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


class _Server:
    """A loopback HTTP server that counts the requests it got."""

    def __init__(self, label: str) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = json.dumps({"server": label, "path": self.path}).encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    """The allowed server and one that is not in the list."""
    a, b = _Server("allowed"), _Server("other")
    yield a, b
    a.close()
    b.close()


@pytest.fixture(params=["local", "docker"])
async def pinned_backend(
    request: pytest.FixtureRequest, sandbox_state_dir: Path, sandbox_base_image: Any
) -> AsyncIterator[Any]:
    """Each host backend with `allowed.test` pinned to host loopback by the operator."""
    pins = {NAME: "127.0.0.1"}
    state = sandbox_state_dir / f"net-{request.param}-{uuid.uuid4().hex[:6]}"
    if request.param == "local":
        from sandboxes.backends.local import LocalBackend
        from tests.fixtures.sandboxes import require_bwrap

        require_bwrap()
        b: Any = LocalBackend(state_dir=state, rootfs=sandbox_base_image.rootfs, egress_hosts=pins)
    else:
        from sandboxes.backends.docker import DockerBackend

        b = DockerBackend(state_dir=state, image=sandbox_base_image.tag, egress_hosts=pins)
    yield b
    for h in await b.list():
        await b.destroy(h)
    await b.close()


FETCH = (
    "import sys,urllib.request as u\n"
    "try:\n"
    "    print(u.urlopen(sys.argv[1],timeout=5).read().decode())\n"
    "except Exception as e:\n"
    "    print('FAILED', type(e).__name__, e); sys.exit(3)\n"
)


async def fetch(sb: Any, url: str) -> Any:
    return await sb.exec(["python3", "-c", FETCH, url], timeout=60)


async def test_allowlist_reaches_only_the_listed_host_port(
    pinned_backend: Any, servers: tuple[_Server, _Server], loopback_http_server: str
) -> None:
    allowed, other = servers
    spec = SandboxSpec(
        rollout_id=rid(),
        gateway=GatewayChannel(target=loopback_http_server),
        network=NetworkPolicy(mode="allowlist", allowed_hosts=[f"{NAME}:{allowed.port}"]),
    )
    sb = await pinned_backend.create(spec)
    try:
        r = await fetch(sb, f"http://{NAME}:{allowed.port}/hello")
        assert r.ok, r
        assert json.loads(r.stdout) == {"server": "allowed", "path": "/hello"}
        assert allowed.hits == ["/hello"]
        # The name maps to a loopback address of its own; the image's entries stay.
        hosts = await sb.exec(["getent", "hosts", NAME])
        assert hosts.stdout.split()[:1] == ["127.77.0.1"], hosts
        local = await sb.exec(["getent", "hosts", "localhost"])
        assert local.ok and local.stdout.split()[0] in ("127.0.0.1", "::1"), local
        # curl through the relay too (what agents and task setups use).
        c = await sb.exec(["curl", "-sS", "--max-time", "5", f"http://{NAME}:{allowed.port}/c"])
        assert c.ok and json.loads(c.stdout)["path"] == "/c", c
        # Not listed: the other server's port under the allowed name, and by address.
        for url in (
            f"http://{NAME}:{other.port}/x",
            f"http://127.0.0.1:{other.port}/x",
            f"http://127.77.0.1:{other.port}/x",
            f"http://other.test:{allowed.port}/x",
        ):
            r = await fetch(sb, url)
            assert r.exit_code == 3 and "FAILED" in r.stdout, (url, r)
        assert other.hits == []
        # Still no interface but lo and no route out.
        routes = await sb.exec(["cat", "/proc/net/route"])
        assert routes.ok and routes.stdout.strip().splitlines()[1:] == [], routes.stdout
        ip = await sb.exec(["ip", "route", "show", "table", "all"])
        assert "default" not in ip.stdout
        links = await sb.exec(["ip", "-o", "link"])
        assert [ln.split(":")[1].strip() for ln in links.stdout.splitlines()] == ["lo"]
        # The Gateway channel works beside the relays.
        gw = await fetch(sb, f"{sb.gateway_base_url}/v1/models")
        assert gw.ok and json.loads(gw.stdout)["path"] == "/v1/models", gw
    finally:
        await sb.destroy()
    sdir = Path(sb.handle.details["state_dir"])
    assert not sdir.exists()


async def test_allowlist_relay_survives_a_worker_restart(
    pinned_backend: Any, servers: tuple[_Server, _Server]
) -> None:
    """A re-attach (the next activity, maybe another process) serves the relays again."""
    from sandboxes.network.gateway_channel import close_bridge

    allowed, _ = servers
    spec = SandboxSpec(
        rollout_id=rid(),
        network=NetworkPolicy(mode="allowlist", allowed_hosts=[f"{NAME}:{allowed.port}"]),
    )
    sb = await pinned_backend.create(spec)
    try:
        sock = Path(sb.handle.details["state_dir"]) / "run" / "egress-0.sock"
        close_bridge(str(sock))  # as if the process serving it had died
        assert (await fetch(sb, f"http://{NAME}:{allowed.port}/gone")).exit_code == 3
        again = await pinned_backend.attach(sb.handle)
        r = await fetch(again, f"http://{NAME}:{allowed.port}/back")
        assert r.ok and json.loads(r.stdout)["path"] == "/back", r
    finally:
        await sb.destroy()


async def test_allowlist_listens_exactly_for_its_routes(sandbox_backend: Any) -> None:
    """A name without a port gets 80 and 443, each name its own address; nothing else
    listens in the sandbox but the Gateway forwarder. Nothing connects here, so these
    names are never resolved."""
    spec = SandboxSpec(
        rollout_id=rid(),
        network=NetworkPolicy(mode="allowlist", allowed_hosts=["a.invalid", "b.invalid:8443"]),
    )
    sb = await sandbox_backend.create(spec)
    try:
        run = Path(sb.handle.details["state_dir"]) / "run"
        socks = sorted(p.name for p in run.glob("egress-*.sock"))
        assert socks == ["egress-0.sock", "egress-1.sock", "egress-2.sock"]
        listening = await sb.exec("cat /proc/net/tcp | awk 'NR>1 && $4==\"0A\" {print $2}'")
        # 127.77.0.1:80, :443 and 127.77.0.2:8443 (little-endian hex), plus the Gateway.
        assert set(listening.stdout.split()) == {
            "01004D7F:0050",
            "01004D7F:01BB",
            "02004D7F:20FB",
            "0100007F:46A0",
        }, listening.stdout
    finally:
        await sb.destroy()


async def test_no_network_reaches_only_the_gateway(
    sandbox_backend: Any, loopback_http_server: str, servers: tuple[_Server, _Server]
) -> None:
    allowed, _ = servers
    spec = SandboxSpec(rollout_id=rid(), gateway=GatewayChannel(target=loopback_http_server))
    sb = await sandbox_backend.create(spec)
    try:
        gw = await fetch(sb, f"{sb.gateway_base_url}/ok")
        assert gw.ok, gw
        for url in (f"http://127.0.0.1:{allowed.port}/x", f"http://{NAME}:{allowed.port}/x"):
            r = await fetch(sb, url)
            assert r.exit_code == 3, (url, r)
        assert allowed.hits == []
        run = Path(sb.handle.details["state_dir"]) / "run"
        assert list(run.glob("egress-*")) == []
        assert NAME not in (await sb.exec(["cat", "/etc/hosts"])).stdout
    finally:
        await sb.destroy()


async def test_public_is_refused_without_the_operators_permission(
    sandbox_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLOUT_ALLOW_PUBLIC_NETWORK", raising=False)
    spec = SandboxSpec(rollout_id=rid(), network=NetworkPolicy(mode="public"))
    with pytest.raises(NetworkPolicyRefused, match="'public'"):
        await sandbox_backend.create(spec)
    assert await sandbox_backend.list() == []


async def test_public_on_local_is_refused_even_when_allowed(
    sandbox_state_dir: Path, sandbox_base_image: Any
) -> None:
    from sandboxes.backends.local import LocalBackend
    from tests.fixtures.sandboxes import require_bwrap

    require_bwrap()
    b = LocalBackend(
        state_dir=sandbox_state_dir / f"pub-{uuid.uuid4().hex[:6]}",
        rootfs=sandbox_base_image.rootfs,
        allow_public_network=True,
    )
    try:
        spec = SandboxSpec(rollout_id=rid(), network=NetworkPolicy(mode="public"))
        with pytest.raises(NetworkPolicyRefused, match="host's network namespace"):
            await b.create(spec)
        assert await b.list() == []
    finally:
        await b.close()


async def test_public_on_docker_with_permission_is_a_bridge_of_its_own(
    sandbox_state_dir: Path, sandbox_base_image: Any
) -> None:
    """Inspected, not used: the container is on a bridge network of its own with an
    address and a default route, while a no-network one on the same backend has none.
    (What that network cannot reach: test_docker_public_network.py.)"""
    from sandboxes.backends.docker import DockerBackend
    from sandboxes.network.docker_network import network_name

    b = DockerBackend(
        state_dir=sandbox_state_dir / f"pub-{uuid.uuid4().hex[:6]}",
        image=sandbox_base_image.tag,
        allow_public_network=True,
    )
    pub = await b.create(SandboxSpec(rollout_id=rid(), network=NetworkPolicy(mode="public")))
    off = await b.create(SandboxSpec(rollout_id=rid()))
    try:
        attrs = b.client.api.inspect_container(pub.handle.details["container_id"])
        own = network_name(pub.handle.sandbox_id)
        assert attrs["HostConfig"]["NetworkMode"] == own
        assert attrs["NetworkSettings"]["Networks"][own]["IPAddress"]
        routes = await pub.exec(["ip", "route"])
        assert routes.stdout.startswith("default via"), routes
        attrs = b.client.api.inspect_container(off.handle.details["container_id"])
        assert attrs["HostConfig"]["NetworkMode"] == "none"
        assert "bridge" not in attrs["NetworkSettings"]["Networks"]
    finally:
        await pub.destroy()
        await off.destroy()
        await b.close()


async def test_warm_pool_keeps_policies_apart(
    sandbox_state_dir: Path, sandbox_base_image: Any, servers: tuple[_Server, _Server]
) -> None:
    """A blank warmed for no-network is never handed to an allowlist task: the policy
    is fixed when a sandbox starts, so it is part of the pool key."""
    from sandboxes.backends.docker import DockerBackend

    allowed, _ = servers
    b = DockerBackend(
        state_dir=sandbox_state_dir / f"pool-{uuid.uuid4().hex[:6]}",
        image=sandbox_base_image.tag,
        pool_size=1,
        egress_hosts={NAME: "127.0.0.1"},
    )
    try:
        net = NetworkPolicy(mode="allowlist", allowed_hosts=[f"{NAME}:{allowed.port}"])
        await b.warm(SandboxSpec(rollout_id=""), wait=True)
        await b.warm(SandboxSpec(rollout_id="", network=net), wait=True)
        plain = await b.create(SandboxSpec(rollout_id=rid()))
        listed = await b.create(SandboxSpec(rollout_id=rid(), network=net))
        try:
            r = await fetch(listed, f"http://{NAME}:{allowed.port}/pooled")
            assert r.ok and json.loads(r.stdout)["path"] == "/pooled", r
            assert (await fetch(plain, f"http://{NAME}:{allowed.port}/x")).exit_code == 3
        finally:
            await plain.destroy()
            await listed.destroy()
    finally:
        for h in await b.list():
            await b.destroy(h)
        await b.close()
