"""E2B backend through the real `e2b` SDK against `FakeE2BApiForTests` (loopback).

The E2B cloud is unreachable here, so these tests verify our backend at the SDK's
HTTP boundary only: the SDK calls we make, the metadata/labels we send, how we map
exec/files/timeouts/destroy/list onto them. They do NOT verify the real service's
behaviour (templates, quotas, network policy enforcement, HTTP/2) — see
docs/sandboxes.md.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from sandboxes.base import (
    ArchiveTooLarge,
    GatewayChannel,
    NetworkPolicy,
    NetworkPolicyRefused,
    SandboxFile,
    SandboxNotFound,
    SandboxSpec,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


async def test_e2b_backend_against_fake_api_lifecycle_exec_files(
    e2b_backend: Any, fake_e2b_api: Any
) -> None:
    spec = SandboxSpec(
        rollout_id=rid(),
        env={"SPEC_VAR": "v"},
        files=[SandboxFile(path="task.md", content="do it\n")],
        setup=["echo setup > setup.txt"],
        labels={"task": "t1"},
        timeout_s=120,
        gateway=GatewayChannel(public_url="https://gw.example.invalid/s/abc"),
    )
    sb = await e2b_backend.create(spec)
    try:
        created = next(s for s in fake_e2b_api.sandboxes.values())
        assert created["template"] == "agentic-rollout-base"
        assert created["metadata"]["agentic-rollout.rollout-id"] == spec.rollout_id
        assert created["metadata"]["task"] == "t1"
        assert created["timeout"] == 120
        assert created["network"] == {"allowOut": ["gw.example.invalid"], "denyOut": ["0.0.0.0/0"]}
        assert sb.gateway_base_url == "https://gw.example.invalid/s/abc"
        assert sb.workdir == "/home/user/workspace"
        chunks: list[Any] = []
        r = await sb.exec("cat task.md setup.txt; echo $SPEC_VAR; echo e >&2; exit 4",
                          on_output=chunks.append)  # fmt: skip
        assert r.exit_code == 4 and r.stdout == "do it\nsetup\nv\n" and r.stderr == "e\n"
        assert {c.stream for c in chunks} == {"stdout", "stderr"}
        r = await sb.exec(["printf", "%s", "a b"], env={"X": "1"})
        assert r.ok and r.stdout == "a b"
        r = await sb.exec(["wc", "-c"], stdin=b"12345")
        assert r.stdout.strip() == "5"
        await sb.put_file("/home/user/workspace/dir/f.bin", bytes(range(256)))
        assert await sb.get_file("/home/user/workspace/dir/f.bin") == bytes(range(256))
        with pytest.raises(SandboxNotFound):
            await sb.get_file("/nope")
        again = await e2b_backend.attach(sb.handle)
        assert (await again.exec(["echo", "hi"])).stdout == "hi\n"
        listed = await e2b_backend.list()
        assert [h.rollout_id for h in listed] == [spec.rollout_id]
    finally:
        await sb.destroy()
        await sb.destroy()  # idempotent (404 swallowed)
    assert fake_e2b_api.sandboxes == {}
    assert "POST /process.Process/Start" in fake_e2b_api.calls
    assert "DELETE /sandboxes/" + sb.handle.sandbox_id in fake_e2b_api.calls


async def test_e2b_backend_against_fake_api_timeout_kills(e2b_backend: Any) -> None:
    sb = await e2b_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        t0 = time.monotonic()
        r = await sb.exec("sleep 613", timeout=1.0)
        # Killed at its timeout, not waited for: the command alone lasts 613 s.
        assert r.timed_out and r.exit_code == 137 and time.monotonic() - t0 < 613
        ps = "ps -eo args | grep -c '^sleep 613' || true"
        deadline = time.monotonic() + 60  # for a condition, not a speed
        while (await sb.exec(ps)).stdout.strip() != "0":
            assert time.monotonic() < deadline, "the timed-out command survived"
            await asyncio.sleep(0.1)
    finally:
        await sb.destroy()


async def test_e2b_backend_against_fake_api_idempotent_create_and_reap(
    e2b_backend: Any, fake_e2b_api: Any
) -> None:
    r1, r2 = rid(), rid()
    a = await e2b_backend.create(SandboxSpec(rollout_id=r1))
    a2 = await e2b_backend.create(SandboxSpec(rollout_id=r1))  # retried activity
    b = await e2b_backend.create(SandboxSpec(rollout_id=r2))
    ids = {h.sandbox_id for h in await e2b_backend.list()}
    assert ids == {a2.handle.sandbox_id, b.handle.sandbox_id}
    assert await e2b_backend.reap({r1}) == [b.handle.sandbox_id]
    assert {h.rollout_id for h in await e2b_backend.list()} == {r1}
    await a2.destroy()
    await a.destroy()


async def test_e2b_backend_against_fake_api_kill_all_processes(e2b_backend: Any) -> None:
    """Best effort on E2B: detached leftovers of the agent's commands are killed, the
    sandbox (its envd; here the fake's supervisor) keeps serving commands and files."""
    sb = await e2b_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        r = await sb.exec(
            "setsid sh -c 'sleep 801 & sleep 802' >/dev/null 2>&1 & "
            "nohup sleep 803 >/dev/null 2>&1 & echo kept > kept.txt"
        )
        assert r.ok, r
        ps = "ps -eo args | grep -c '^sleep 80[1-3]' || true"
        deadline = time.monotonic() + 60
        while (await sb.exec(ps)).stdout.strip() != "3":
            assert time.monotonic() < deadline, "the leftovers never started"
            await asyncio.sleep(0.1)
        await sb.kill_all_processes()
        assert (await sb.exec(ps)).stdout.strip() == "0"
        assert await sb.get_file(f"{sb.workdir}/kept.txt") == b"kept\n"
    finally:
        await sb.destroy()


async def test_e2b_backend_against_fake_api_archive_cap(e2b_backend: Any) -> None:
    """An archive over the cap is refused before any download (its size is checked in
    the sandbox), with the same error as the other backends."""
    sb = await e2b_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        assert (await sb.exec("head -c 3000000 /dev/zero > big.bin")).ok
        with pytest.raises(ArchiveTooLarge, match="exceeds 1000000 bytes"):
            await sb.get_file(f"{sb.workdir}/big.bin", max_bytes=1_000_000)
        assert len(await sb.get_file(f"{sb.workdir}/big.bin", max_bytes=4_000_000)) == 3_000_000
    finally:
        await sb.destroy()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://203.0.113.7:8080", "is an IP address"),
        ("https://[2001:db8::1]", "is an IP address"),
        ("https://gw.example.invalid:8443", "port 8443 is not https's default"),
        ("http://gw.example.invalid:443", "port 443 is not http's default"),
        ("ftp://gw.example.invalid", "scheme 'ftp'"),
    ],
)
async def test_e2b_egress_that_would_open_the_whole_gateway_host_is_refused(
    e2b_backend: Any, fake_e2b_api: Any, url: str, why: str
) -> None:
    """E2B's firewall has no port field: an IP entry (or a name on a port other than
    80/443) would let the sandbox reach every port of the Gateway's host, so the create
    is refused before any sandbox exists."""
    spec = SandboxSpec(rollout_id=rid(), gateway=GatewayChannel(public_url=url))
    with pytest.raises(ValueError, match=why):
        await e2b_backend.create(spec)
    assert fake_e2b_api.sandboxes == {}
    assert not any(c.startswith("POST /v2/sandboxes") for c in fake_e2b_api.calls)


async def test_e2b_egress_allows_only_the_gateway_endpoint(
    e2b_backend: Any, fake_e2b_api: Any
) -> None:
    """Only the agent endpoint's name is allowed and all other traffic is denied (an
    allow list alone leaves E2B's egress open)."""
    spec = SandboxSpec(
        rollout_id=rid(), gateway=GatewayChannel(public_url="http://agents.gw.example.invalid/")
    )
    sb = await e2b_backend.create(spec)
    try:
        created = fake_e2b_api.sandboxes[sb.handle.sandbox_id]
        assert created["network"] == {
            "allowOut": ["agents.gw.example.invalid"],
            "denyOut": ["0.0.0.0/0"],
        }
    finally:
        await sb.destroy()


async def test_e2b_allowlist_adds_the_tasks_names_to_the_gateway(
    e2b_backend: Any, fake_e2b_api: Any
) -> None:
    """A task's allowlist reaches E2B as name entries beside the Gateway's, all else
    denied; a port E2B cannot filter by is refused before any sandbox exists."""
    net = NetworkPolicy(mode="allowlist", allowed_hosts=["pypi.org", "files.example.com:443"])
    spec = SandboxSpec(
        rollout_id=rid(),
        gateway=GatewayChannel(public_url="https://gw.example.invalid/s/abc"),
        network=net,
    )
    sb = await e2b_backend.create(spec)
    try:
        assert fake_e2b_api.sandboxes[sb.handle.sandbox_id]["network"] == {
            "allowOut": ["gw.example.invalid", "pypi.org", "files.example.com"],
            "denyOut": ["0.0.0.0/0"],
        }
    finally:
        await sb.destroy()
    creates = sum(c.startswith("POST /v2/sandboxes") for c in fake_e2b_api.calls)
    bad = NetworkPolicy(mode="allowlist", allowed_hosts=["pypi.org:8080"])
    with pytest.raises(NetworkPolicyRefused, match="only on ports 80 and 443"):
        await e2b_backend.create(SandboxSpec(rollout_id=rid(), network=bad))
    assert sum(c.startswith("POST /v2/sandboxes") for c in fake_e2b_api.calls) == creates


async def test_e2b_public_only_with_the_operators_permission(
    e2b_backend: Any, fake_e2b_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SandboxSpec(rollout_id=rid(), network=NetworkPolicy(mode="public"))
    e2b_backend.allow_public_network = False
    with pytest.raises(NetworkPolicyRefused, match="--allow-public-network"):
        await e2b_backend.create(spec)
    assert not any(c.startswith("POST /v2/sandboxes") for c in fake_e2b_api.calls)
    e2b_backend.allow_public_network = True
    sb = await e2b_backend.create(spec)
    try:
        created = fake_e2b_api.sandboxes[sb.handle.sandbox_id]
        assert created["allow_internet_access"] is True and created["network"] is None
    finally:
        await sb.destroy()
