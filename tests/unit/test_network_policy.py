"""A task's network policy: how entries are written, what each backend refuses, and the
relay plan an allowlist becomes (names → loopback addresses, ports, sockets)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from sandboxes.backends.e2b import network_options
from sandboxes.base import NetworkPolicyRefused, SandboxSpec
from sandboxes.network.egress_relay import (
    check_policy,
    connect_upstream,
    egress_routes,
    forward_args,
    hosts_file,
    inside_names,
    policy_key,
    public_network_allowed,
    validate_pins,
)
from schemas.environment import NetworkPolicy
from schemas.tasks import RolloutTask


def allow(*hosts: str) -> NetworkPolicy:
    return NetworkPolicy(mode="allowlist", allowed_hosts=list(hosts))


def test_entries_are_names_with_optional_ports_normalized() -> None:
    p = allow("PyPI.org", "files.pythonhosted.org:443", "pypi.org", "mirror.example.com.:8080")
    assert p.allowed_hosts == ["pypi.org", "files.pythonhosted.org:443", "mirror.example.com:8080"]


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("10.0.0.1:80", "not an IP address"),
        ("[::1]:443", "not an IP address"),
        ("*.example.com", "not a valid host name"),
        ("https://pypi.org", "port must be a number"),
        ("pypi.org/simple", "not a valid host name"),
        ("pypi.org:0", "port must be a number 1-65535"),
        ("pypi.org:70000", "port must be a number 1-65535"),
        ("-bad-.example.com", "not a valid host name"),
        ("", "not a valid host name"),
        ("localhost:8000", "localhost is the sandbox itself"),
        ("app.localhost", "localhost is the sandbox itself"),
    ],
)
def test_bad_entries_are_refused_naming_the_entry(entry: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        allow(entry)


def test_hosts_are_only_for_an_allowlist() -> None:
    with pytest.raises(ValidationError, match="only for mode 'allowlist'"):
        NetworkPolicy(mode="no-network", allowed_hosts=["pypi.org"])
    with pytest.raises(ValidationError, match="only for mode 'allowlist'"):
        NetworkPolicy(mode="public", allowed_hosts=["pypi.org"])


def _task(network: dict[str, object]) -> RolloutTask:
    return RolloutTask.model_validate(
        {
            "task_id": "t",
            "prompt": "p",
            "harness": {"name": "command"},
            "sandbox": {"backend": "docker", "network": network},
        }
    )


def test_a_task_with_a_bad_entry_is_refused_when_it_is_read() -> None:
    with pytest.raises(ValidationError, match=r"sandbox.network.allowed_hosts"):
        _task({"mode": "allowlist", "allowed_hosts": ["1.2.3.4"]})


def test_the_task_policy_passes_through_to_the_sandbox_spec() -> None:
    task = _task({"mode": "allowlist", "allowed_hosts": ["PyPI.org"]})
    spec = SandboxSpec.model_validate({**task.sandbox.spec_fields(), "rollout_id": "r"})
    assert spec.network == NetworkPolicy(mode="allowlist", allowed_hosts=["pypi.org"])
    assert (
        SandboxSpec.model_validate(
            {**_task_without_network().sandbox.spec_fields(), "rollout_id": "r"}
        ).network
        == NetworkPolicy()
    )


def _task_without_network() -> RolloutTask:
    return RolloutTask.model_validate(
        {"task_id": "t", "prompt": "p", "harness": {"name": "command"}}
    )


def test_empty_allowlist_is_no_network() -> None:
    assert allow().effective_mode() == "no-network"
    assert egress_routes(allow()) == []
    assert policy_key(allow()) == policy_key(NetworkPolicy())
    assert policy_key(allow("a.example", "b.example")) == policy_key(
        allow("b.example", "a.example")
    )
    assert policy_key(allow("a.example")) != policy_key(NetworkPolicy())


def test_routes_give_each_name_an_address_and_default_ports() -> None:
    routes = egress_routes(allow("pypi.org", "mirror.example.com:8080", "mirror.example.com:443"))
    got = [(r.host, r.port, r.inside_addr, r.socket_name) for r in routes]
    assert got == [
        ("mirror.example.com", 443, "127.77.0.1", "egress-0.sock"),
        ("mirror.example.com", 8080, "127.77.0.1", "egress-1.sock"),
        ("pypi.org", 80, "127.77.0.2", "egress-2.sock"),
        ("pypi.org", 443, "127.77.0.2", "egress-3.sock"),
    ]
    assert inside_names(routes) == {"mirror.example.com": "127.77.0.1", "pypi.org": "127.77.0.2"}
    assert forward_args(routes[:1], "/run/rollout") == [
        "--forward",
        "127.77.0.1:443:/run/rollout/egress-0.sock",
    ]


def test_hosts_file_keeps_the_image_entries() -> None:
    image = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"
    text = hosts_file(image, egress_routes(allow("pypi.org")))
    assert text.startswith(image)
    assert text.splitlines()[-1] == "127.77.0.1 pypi.org"
    # An exported image's /etc/hosts is empty (docker writes it at run time).
    empty = hosts_file("", egress_routes(allow("pypi.org"))).splitlines()
    assert empty[0] == "127.0.0.1 localhost" and empty[-1] == "127.77.0.1 pypi.org"


def test_public_needs_the_operator_and_a_backend_that_can_give_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    public = NetworkPolicy(mode="public")
    with pytest.raises(NetworkPolicyRefused, match="--allow-public-network"):
        check_policy(public, "docker", public_allowed=False)
    check_policy(public, "docker", public_allowed=True)
    with pytest.raises(NetworkPolicyRefused, match="'public' on the local backend: no way"):
        check_policy(public, "local", public_allowed=True, public_refusal="no way")
    check_policy(allow("pypi.org"), "docker", public_allowed=False)
    monkeypatch.setenv("ROLLOUT_ALLOW_PUBLIC_NETWORK", "1")
    assert public_network_allowed(None) and not public_network_allowed(False)
    monkeypatch.setenv("ROLLOUT_ALLOW_PUBLIC_NETWORK", "0")
    assert not public_network_allowed(None)


def test_policy_refusal_is_a_bad_task() -> None:
    """A ValueError: the provision activity refuses the task instead of retrying it."""
    assert issubclass(NetworkPolicyRefused, ValueError)


def test_pins_are_names_to_addresses() -> None:
    assert validate_pins({"Mirror.Internal": "10.1.2.3"}) == {"mirror.internal": "10.1.2.3"}
    with pytest.raises(ValueError, match="without a port"):
        validate_pins({"mirror.internal:80": "10.1.2.3"})
    with pytest.raises(ValueError):
        validate_pins({"mirror.internal": "not-an-ip"})


def test_relay_refuses_a_name_that_resolves_to_a_non_public_address() -> None:
    """An unpinned name is connected only to public addresses: localhost (resolved from
    the host's /etc/hosts, nothing is sent) is refused before any connection."""
    with pytest.raises(OSError, match="no public address"):
        asyncio.run(connect_upstream("localhost", 9, {}))


def test_e2b_network_options() -> None:
    """E2B's firewall (the fake stands in for the cloud in integration tests): names on
    80/443 only, the Gateway's name kept, everything else denied."""
    gw = {"public_url": "https://gw.example.invalid/s/x"}
    spec = SandboxSpec(rollout_id="r", gateway=gw, network=allow("pypi.org", "a.example:443"))
    assert network_options(spec, False) == {
        "network": {"allow_out": ["gw.example.invalid", "pypi.org", "a.example"],
                    "deny_out": ["0.0.0.0/0"]}
    }  # fmt: skip
    spec = SandboxSpec(rollout_id="r", network=allow("pypi.org"))
    assert network_options(spec, False)["network"]["allow_out"] == ["pypi.org"]
    assert network_options(SandboxSpec(rollout_id="r"), False) == {"allow_internet_access": False}
    with pytest.raises(NetworkPolicyRefused, match="only on ports 80 and 443"):
        network_options(SandboxSpec(rollout_id="r", network=allow("a.example:8080")), False)
    public = SandboxSpec(rollout_id="r", network=NetworkPolicy(mode="public"))
    with pytest.raises(NetworkPolicyRefused, match="not allowed on this e2b backend"):
        network_options(public, False)
    assert network_options(public, True) == {"allow_internet_access": True}


def test_worker_flag_gives_the_offered_backends_the_permission() -> None:
    from pathlib import Path

    from workers.worker import backend_options

    assert backend_options(["local", "docker"], None, False) == {}
    got = backend_options(["local", "docker", "custom"], Path("/s"), True)
    assert got == {
        "local": {"state_dir": "/s", "allow_public_network": True},
        "docker": {"allow_public_network": True},
    }


def test_worker_flag_pins_egress_names_on_the_relay_backends() -> None:
    import typer

    from workers.worker import backend_options, parse_egress_hosts

    pins = parse_egress_hosts(["allowed.test=127.0.0.1", " mirror.internal = 10.0.0.5 "])
    assert pins == {"allowed.test": "127.0.0.1", "mirror.internal": "10.0.0.5"}
    got = backend_options(["local", "docker", "e2b"], None, False, pins)
    assert got == {"local": {"egress_hosts": pins}, "docker": {"egress_hosts": pins}}
    assert backend_options(["docker"], None, False, {}) == {}
    with pytest.raises(typer.BadParameter, match="not NAME=ADDRESS"):
        parse_egress_hosts(["allowed.test"])
