"""The host reaper against a provision running at the same time (found by `bench/chaos.py`).

The reaper lists this host's sandboxes, looks each rollout up in Temporal (slow), then
reaps. A sandbox provisioned in between belongs to a rollout it never looked up: reaping
it killed a running agent ("sandbox supervisor went away during exec") or failed the
provision, costing the rollout an attempt.
"""

from pathlib import Path
from typing import Any

import pytest

from activities.sandbox import reap_orphans
from devstack.temporal_dev_server import TemporalDevServer
from rollout_client.client import connect
from sandboxes.backends.local import LocalBackend
from sandboxes.base import SandboxBackend, SandboxSpec
from tests.fixtures.sandboxes import require_bwrap

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("system"),
]


class LocalBackendProvisionedDuringReaper(LocalBackend):
    """The real local backend; right after its first listing, a sandbox for another rollout
    is created, as a provision on this host does while the reaper is busy in Temporal."""

    late: Any = None

    async def list(self) -> list[Any]:
        listed = await super().list()
        if self.late is None:
            self.late = await self.create(SandboxSpec(rollout_id="provisioned-meanwhile"))
        return listed


class OneBackend:
    """What `reap_orphans` reads from `SandboxBackends`: the backends in use."""

    def __init__(self, backend: SandboxBackend) -> None:
        self.backend = backend

    def active(self) -> list[SandboxBackend]:
        return [self.backend]


async def test_reaper_keeps_a_sandbox_provisioned_during_its_pass(
    temporal_server: TemporalDevServer, sandbox_state_dir: Path, sandbox_base_image: Any
) -> None:
    require_bwrap()
    backend = LocalBackendProvisionedDuringReaper(
        state_dir=sandbox_state_dir / "race", rootfs=sandbox_base_image.rootfs
    )
    orphan = await backend.create(SandboxSpec(rollout_id="rollout-that-never-ran"))
    client = await connect(temporal_server.address)
    try:
        reaped = await reap_orphans(client, OneBackend(backend))  # type: ignore[arg-type]
        assert reaped == [orphan.handle.sandbox_id]
        left = {h.sandbox_id for h in await backend.list()}
        assert left == {backend.late.handle.sandbox_id}
        assert (await backend.late.exec(["true"])).ok
    finally:
        for handle in await backend.list():
            await backend.destroy(handle)
        await backend.close()
