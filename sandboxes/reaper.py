"""Reaper: destroy sandboxes whose rollout is gone, across backends.

Why: a terminated workflow or a crashed worker never runs the code that would
destroy its sandbox, so sandboxes can outlive their rollout. Every sandbox carries
its rollout id (docker label / state file, local state file, E2B metadata); the
reaper destroys those whose rollout is not in `active_rollout_ids`, whose TTL
(`SandboxSpec.timeout_s`) passed, and unassigned warm-pool blanks whose owning
process is dead.
The CLI (`rollout reaper`) passes the ids of running workflows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from sandboxes.base import BackendUnavailable, SandboxBackend
from sandboxes.registry import BUILTIN_BACKENDS, backend_class, get_backend

log = logging.getLogger(__name__)


async def reap(
    active_rollout_ids: Iterable[str],
    backends: Iterable[str | SandboxBackend] | None = None,
    config: dict[str, dict[str, Any]] | None = None,
) -> dict[str, list[str] | str]:
    """Reap on each backend; returns {backend: reaped sandbox ids | "unavailable: …"}.

    A backend whose runtime is missing (no docker engine, no E2B key) is reported,
    not fatal: the reaper must still clean the others. `backends` defaults to the
    built-in backends whose sandboxes run on this host.
    """
    if backends is None:
        backends = [n for n in BUILTIN_BACKENDS if backend_class(n).host_local]
    active = frozenset(active_rollout_ids)
    out: dict[str, list[str] | str] = {}
    for b in backends:
        backend = b if isinstance(b, SandboxBackend) else None
        name = b if isinstance(b, str) else b.name
        try:
            if backend is None:
                backend = get_backend(name, **(config or {}).get(name, {}))
            out[name] = await backend.reap(active)
        except BackendUnavailable as e:
            out[name] = f"unavailable: {e}"
            log.warning("reaper: %s backend unavailable: %s", name, e)
        finally:
            if backend is not None and not isinstance(b, SandboxBackend):
                await backend.close()
    return out
