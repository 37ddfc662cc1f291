"""A public-mode docker sandbox's own network: reaches out, not sideways or home.

Docker's default bridge puts every public sandbox on one segment (they reach each
other) and lets each reach every service of this host on the bridge's address. So a
public sandbox gets a bridge network of its own (`network_name`), made before its
container and removed after it. Docker already drops traffic between two bridge
networks (its isolation chains); traffic from a sandbox network to this host itself
(any of its addresses, other bridges' gateways included) is refused by one INPUT rule
that matches every such bridge by its interface name prefix (`BRIDGE_PREFIX`), so there
is nothing per sandbox to add or forget in the firewall. The Gateway is unaffected: the
sandbox reaches it through the Unix socket in its run dir, not over IP.

Each network takes one of the engine's address pools (by default about 30 per host):
set `default-address-pools` in /etc/docker/daemon.json (e.g. a /16 cut into /28s) for
more public sandboxes at once.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from typing import Any

from sandboxes.base import NetworkPolicyRefused

#: Prefix of every sandbox network's bridge interface (15 characters at most in all).
BRIDGE_PREFIX = "arn"
NETWORK_PREFIX = "ar-net-"
#: The host rule: nothing that enters from a sandbox bridge is delivered to this host.
HOST_RULE = ["INPUT", "-i", f"{BRIDGE_PREFIX}+", "-j", "REJECT"]
_guard_lock = threading.Lock()


def network_name(sandbox_id: str) -> str:
    return NETWORK_PREFIX + sandbox_id


def bridge_name(sandbox_id: str) -> str:
    """`arn` + the id's 12 hex digits: unique, and within the kernel's 15 characters."""
    return BRIDGE_PREFIX + sandbox_id.rsplit("-", 1)[-1][-12:]


def guard_host() -> None:
    """Make sure the INPUT rule is in place (idempotent; `iptables -w` waits for the
    firewall lock). Without it a public sandbox is refused rather than given a network
    from which this host's services can be reached."""

    def iptables(op: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["iptables", "-w", op, *HOST_RULE], capture_output=True, text=True, check=False
        )

    with _guard_lock:
        try:
            if iptables("-C").returncode == 0:
                return
            added = iptables("-I")
        except OSError as exc:
            added = subprocess.CompletedProcess([], 1, "", str(exc))
        if added.returncode != 0:
            raise NetworkPolicyRefused(
                "network mode 'public' on docker: cannot install the firewall rule that "
                f"keeps sandboxes off this host's services (iptables -I {' '.join(HOST_RULE)}"
                f": {added.stderr.strip() or 'failed'}); the worker needs root and iptables"
            )


def create_network(client: Any, sandbox_id: str, labels: dict[str, str]) -> str:
    """The sandbox's own bridge network (its name), labelled like its container."""
    import docker.errors

    guard_host()
    name = network_name(sandbox_id)
    try:
        client.api.create_network(
            name,
            driver="bridge",
            options={
                "com.docker.network.bridge.name": bridge_name(sandbox_id),
                "com.docker.network.bridge.enable_icc": "false",
            },
            labels=labels,
        )
    except docker.errors.APIError as exc:
        if "address pool" in str(exc) or "non-overlapping" in str(exc):
            raise NetworkPolicyRefused(
                "network mode 'public' on docker: the engine has no address pool left for "
                "another sandbox network (each public sandbox has its own); raise "
                "default-address-pools in /etc/docker/daemon.json"
            ) from exc
        raise
    return name


def remove_network(client: Any, sandbox_id: str) -> None:
    """Remove the sandbox's network if it has one (after its container is gone)."""
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_network(network_name(sandbox_id))
