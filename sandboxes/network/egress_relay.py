"""A task's network policy on the supervised backends: allowlisted hosts through relays.

Why relays: a local or docker sandbox has no network interface but ``lo`` (the Gateway
channel is a Unix socket), and an allowlist must not give it one. So every allowed
``host:port`` is served like the Gateway: inside the sandbox the name resolves to a
loopback address of its own (docker: ``extra_hosts``; local: a generated /etc/hosts,
the image's entries kept), where the supervisor listens on that port and forwards each
connection to a Unix socket in the sandbox's run dir; the host side of that socket
(a relay on the Gateway channel's loop, `gateway_channel.ensure_relay`) resolves the
name with the host's resolver and connects. Nothing else has a name or a listener, so
nothing else is reachable.

The host side connects only to public addresses: a name that resolves to loopback, a
private network or link-local (the host's own services, the cloud metadata endpoint)
is refused per connection, so a task cannot reach the sandbox host's neighbourhood by
listing a name that points there. An operator who wants a name to reach such an
address pins it (`egress_hosts`: name → address, the backend option); a pinned name
goes to its pinned address and to nothing the resolver says.

`public` is given only with the operator's permission (`allow_public_network`, or
``ROLLOUT_ALLOW_PUBLIC_NETWORK=1``); how each backend gives it, or why it refuses, is
the backend's (see docs/sandboxes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandboxes.base import NetworkPolicy, NetworkPolicyRefused
from sandboxes.network.gateway_channel import bridge_is_open, close_bridge, ensure_relay
from schemas.environment import parse_allowed_host

log = logging.getLogger(__name__)

#: Ports an allowlist entry without one opens (HTTP and HTTPS).
DEFAULT_PORTS = (80, 443)
#: Allowlisted names get consecutive loopback addresses from here on (away from
#: 127.0.0.1, where the Gateway forwarder and the agent's own servers listen, and from
#: 127.0.1.1, which Debian's /etc/hosts gives the host name).
FIRST_ADDRESS = ipaddress.IPv4Address("127.77.0.1")
#: At most this many distinct names (the addresses stay inside 127.77.0.0/16).
MAX_NAMES = 1000
#: The operator's permission for `public`, when the backend option is not given.
PUBLIC_ENV = "ROLLOUT_ALLOW_PUBLIC_NETWORK"
SOCKET_PREFIX = "egress-"


@dataclass(frozen=True)
class EgressRoute:
    """One allowed ``host:port``: where the sandbox reaches it and through which socket."""

    host: str
    port: int
    inside_addr: str
    socket_name: str


def public_network_allowed(option: bool | None) -> bool:
    """The backend option, else ``ROLLOUT_ALLOW_PUBLIC_NETWORK=1``."""
    return option if option is not None else os.environ.get(PUBLIC_ENV) == "1"


def policy_key(policy: NetworkPolicy) -> str:
    """What the policy fixes when a sandbox starts, normalized (a pool key part)."""
    mode = policy.effective_mode()
    hosts = sorted(policy.allowed_hosts) if mode == "allowlist" else []
    return NetworkPolicy(mode=mode, allowed_hosts=hosts).model_dump_json()


def egress_routes(policy: NetworkPolicy) -> list[EgressRoute]:
    """The relays an allowlist needs (none for other modes), in a stable order."""
    if policy.effective_mode() != "allowlist":
        return []
    ports: dict[str, list[int]] = {}
    for entry in policy.allowed_hosts:
        host, port = parse_allowed_host(entry)
        wanted = ports.setdefault(host, [])
        for p in DEFAULT_PORTS if port is None else (port,):
            if p not in wanted:
                wanted.append(p)
    if len(ports) > MAX_NAMES:
        raise NetworkPolicyRefused(f"allowlist has {len(ports)} names; at most {MAX_NAMES}")
    routes = []
    for i, host in enumerate(sorted(ports)):
        addr = str(FIRST_ADDRESS + i)
        for p in sorted(ports[host]):
            routes.append(EgressRoute(host, p, addr, f"{SOCKET_PREFIX}{len(routes)}.sock"))
    return routes


def inside_names(routes: Sequence[EgressRoute]) -> dict[str, str]:
    """Name → loopback address inside the sandbox (docker's ``extra_hosts``)."""
    return {r.host: r.inside_addr for r in routes}


def forward_args(routes: Sequence[EgressRoute], run_dir: str) -> list[str]:
    """The supervisor's ``--forward ADDR:PORT:SOCKET`` arguments for `routes`."""
    out: list[str] = []
    for r in routes:
        out += ["--forward", f"{r.inside_addr}:{r.port}:{run_dir}/{r.socket_name}"]
    return out


def hosts_file(image_hosts: str, routes: Sequence[EgressRoute]) -> str:
    """The image's /etc/hosts with the allowlisted names added (local backend); with
    the usual localhost lines first when it has none (an exported image's is empty:
    docker writes it at run time)."""
    lines = [image_hosts.rstrip("\n")] if image_hosts.strip() else []
    names = {w for ln in image_hosts.splitlines() for w in ln.split("#")[0].split()[1:]}
    if "localhost" not in names:
        lines[:0] = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines.append("# allowlisted hosts, served by the sandbox's egress relays")
    lines += [f"{addr} {name}" for name, addr in inside_names(routes).items()]
    return "\n".join(lines) + "\n"


def check_policy(
    policy: NetworkPolicy,
    backend: str,
    *,
    public_allowed: bool,
    public_refusal: str | None = None,
) -> None:
    """Refuse a policy this backend will not give (`NetworkPolicyRefused`, naming it).

    `public_refusal`: why this backend never gives public network (None: it can, with
    the operator's permission).
    """
    if policy.mode != "public":
        egress_routes(policy)  # a too-long list is refused before anything starts
        return
    if public_refusal is not None:
        raise NetworkPolicyRefused(
            f"network mode 'public' on the {backend} backend: {public_refusal}"
        )
    if not public_allowed:
        raise NetworkPolicyRefused(
            f"network mode 'public' is not allowed on this {backend} backend: the operator "
            f"must allow it (worker flag --allow-public-network, {PUBLIC_ENV}=1, or the "
            "backend option allow_public_network)"
        )


def validate_pins(pins: Mapping[str, str] | None) -> dict[str, str]:
    """The operator's `egress_hosts`: valid names → IP addresses (ValueError otherwise)."""
    out: dict[str, str] = {}
    for name, addr in (pins or {}).items():
        host, port = parse_allowed_host(name)
        if port is not None:
            raise ValueError(f"egress_hosts: {name!r} must be a name without a port")
        out[host] = str(ipaddress.ip_address(addr))
    return out


async def connect_upstream(
    host: str, port: int, pins: Mapping[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to an allowlisted ``host:port`` from the host: its pinned address, else
    the public addresses the host's resolver gives (resolved once, connected by address,
    so the name cannot be re-resolved elsewhere in between). OSError when refused."""
    if host in pins:
        return await asyncio.open_connection(pins[host], port)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    public = []
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if ip.is_global and not ip.is_multicast and str(ip) not in public:
            public.append(str(ip))
    if not public:
        log.warning("egress to %s:%d refused: it resolves to no public address", host, port)
        raise OSError(f"{host} resolves to no public address")
    last: OSError | None = None
    for addr in public:
        try:
            return await asyncio.open_connection(addr, port)
        except OSError as e:
            last = e
    assert last is not None
    raise last


def open_relays(run_dir: Path, routes: Sequence[EgressRoute], pins: Mapping[str, str]) -> None:
    """Serve each route's socket in the sandbox's host run dir (idempotent)."""
    for r in routes:

        async def connect(
            r: EgressRoute = r,
        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await connect_upstream(r.host, r.port, pins)

        key = f"egress:{r.host}:{r.port}:{pins.get(r.host, '')}"
        ensure_relay(str(run_dir / r.socket_name), key, connect)


def reopen_relays(run_dir: Path, routes: Sequence[EgressRoute], pins: Mapping[str, str]) -> None:
    """After a restart (attach): serve the routes whose relay is not served here."""
    missing = [r for r in routes if not bridge_is_open(str(run_dir / r.socket_name))]
    if missing:
        open_relays(run_dir, missing, pins)


def close_relays(run_dir: Path) -> None:
    """Stop serving every egress socket of a sandbox (idempotent)."""
    with contextlib.suppress(OSError):
        for sock in run_dir.glob(f"{SOCKET_PREFIX}*.sock"):
            close_bridge(str(sock))
