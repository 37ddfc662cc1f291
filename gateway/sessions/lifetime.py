"""When a session's lifetime is over: its idle and absolute TTLs, fixed at creation.

Why: a rollout whose workflow was terminated or timed out never closes its session, so
its token would stay valid and its held tokens stay in memory for good. The TTLs bound
both; the core refuses calls past them and the session reaper closes such sessions.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.capture.store import SessionMeta

ExpiryKind = Literal["idle", "absolute"]

#: Wall-clock seconds (`time.time` in service). The gateway reads session time through one,
#: so a test can move it forward instead of sleeping past a TTL and racing its own calls.
Clock = Callable[[], float]


@dataclass(frozen=True)
class Expiry:
    """Which TTL ran out, and a sentence for the agent, the log and the `closed` marker."""

    kind: ExpiryKind
    reason: str


def expiry(meta: SessionMeta, last_active: float, now: float) -> Expiry | None:
    """The TTL a session has outlived at `now` (wall-clock seconds), if any.

    `last_active` is the latest sign of use (a call accepted or a record written); the
    absolute TTL counts from `created_at`, so a session revived after a restart keeps its
    original deadline.
    """
    config = meta.config
    created = meta.created_at.timestamp()
    age = now - created
    if config.absolute_ttl_s is not None and age > config.absolute_ttl_s:
        return Expiry(
            "absolute",
            f"expired: created {age:.1f}s ago, past its absolute TTL of {config.absolute_ttl_s:g}s",
        )
    idle = now - max(last_active, created)
    if config.idle_ttl_s is not None and idle > config.idle_ttl_s:
        return Expiry(
            "idle",
            f"expired: no call for {idle:.1f}s, past its idle TTL of {config.idle_ttl_s:g}s",
        )
    return None
