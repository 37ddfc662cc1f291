"""The bodies of the Gateway's policy-update control calls (`POST /policy`, `GET /policy`,
`POST /policy/hold`, `POST /policy/release`).

Why here: the Gateway serves them and the trainer calls them (`rollout_client.policy`),
and `schemas` is the one package both may import. An update pauses new engine calls (they
wait, they are not failed), drains the ones in flight, has every engine load the
checkpoint, sets the version that later calls record, and resumes; with several gateway
processes the one that gets the call pauses the others first (through their control
listeners). An external update is the same pause and drain split in two calls around a
weight sync the trainer does itself (NCCL, IPC: no checkpoint directory): hold, sync,
release with the version the engines now serve.
"""

from datetime import datetime
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, Field, model_validator

from schemas.base import StrictModel

UNKNOWN_WEIGHTS = "unknown"
"""The version label of an engine whose weights are not known: a load failed on it after
it had started to change them and putting the previous ones back failed too (or none is
known). Calls it samples carry this label, which names no policy, so no trainer takes
them for any version's samples. Reserved: no update may use it."""

PauseMode = Literal["wait", "keep", "abort"]
"""How an engine pauses for a weight load: `wait` lets in-flight requests finish, `keep`
freezes them, `abort` drops them."""


class WeightUpdate(StrictModel):
    """One engine's switch to a checkpoint (the engine-side part of a policy update)."""

    policy_version: str = Field(min_length=1, max_length=256)
    checkpoint: str = Field(min_length=1, description="model directory the engine can read")


class WeightUpdateReport(StrictModel):
    engine: str
    policy_version: str
    method: Literal["reload", "restart"]
    pause_s: float
    load_s: float
    total_s: float


def _not_reserved(value: str) -> str:
    if value == UNKNOWN_WEIGHTS:
        raise ValueError(f"{UNKNOWN_WEIGHTS!r} is reserved for engines in an unknown state")
    return value


Version = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_not_reserved)]
"""A policy version a caller names (never the reserved `unknown`)."""

UpdateId = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
]
"""An external update's id, chosen by the trainer: a name it logs (no spaces, no slashes)."""


class PolicyUpdate(StrictModel):
    """Body of `POST /policy`."""

    policy_version: Version
    checkpoint: str = Field(
        min_length=1, description="model directory every engine can read (absolute path)"
    )
    drain_timeout_s: float = Field(
        default=600.0, gt=0, le=3600, description="how long in-flight calls may take to finish"
    )


class PolicyHold(StrictModel):
    """Body of `POST /policy/hold`: pause and drain every gateway process, as an update
    does, and keep them paused while the trainer syncs weights into its engines itself.
    New engine calls wait at the gate; the hold ends with `POST /policy/release`, or
    after `lease_s` without one (then every engine is labelled `unknown`: the Gateway
    cannot know whether the sync finished)."""

    update_id: UpdateId
    policy_version: Version | None = Field(
        default=None,
        description="the version the trainer is about to sync (for the history and logs; "
        "the release names the version served)",
    )
    drain_timeout_s: float = Field(
        default=600.0, gt=0, le=3600, description="how long in-flight calls may take to finish"
    )
    lease_s: float = Field(
        default=600.0,
        gt=0,
        le=7200,
        description="how long the hold may last without a release (from the end of the drain)",
    )


class PolicyHeld(StrictModel):
    """Reply of `POST /policy/hold`: every gateway process is paused and drained; no engine
    call is in flight until the release."""

    update_id: str
    processes: int = Field(description="gateway processes paused (this one too)")
    drained_calls: int = Field(description="engine calls that were in flight, all finished")
    drain_s: float
    previous_version: str | None = Field(description="the version served before the hold")
    lease_s: float
    expires_at: datetime = Field(description="when the hold ends by itself without a release")


class PolicyRelease(StrictModel):
    """Body of `POST /policy/release`: how the trainer's weight sync ended. `policy_version`
    alone: the engines serve it now. `error`: the sync failed; `touched` says whether it
    had begun to change weights (then every engine is labelled `unknown`) or not (the
    previous version keeps serving). `policy_version` with `error` names the version the
    sync was for (the history shows it)."""

    update_id: UpdateId
    policy_version: Version | None = None
    error: str | None = Field(default=None, min_length=1, max_length=2000)
    touched: bool = Field(
        default=True,
        description="with `error`: the sync may have changed the engines' weights",
    )

    @model_validator(mode="after")
    def _outcome(self) -> Self:
        if self.policy_version is None and self.error is None:
            raise ValueError(
                "give policy_version (the version the engines now serve) or error (the sync failed)"
            )
        return self


class EngineServing(StrictModel):
    """What one engine serves: the version calls on it are recorded with."""

    engine: str
    policy_version: str | None = Field(
        description="None: the weights it was started with (calls record their session's "
        f"label); {UNKNOWN_WEIGHTS!r}: not known after a failed load"
    )
    checkpoint: str | None = None


class PeerPause(StrictModel):
    """Body of `POST /policy/pause` (process to process): pause and drain this process's
    engine calls for `update_id`; it resumes by itself after `lease_s` if the
    coordinating process never says how the update ended."""

    update_id: str = Field(min_length=1, max_length=64)
    drain_timeout_s: float = Field(default=600.0, gt=0, le=3600)
    lease_s: float = Field(default=3600.0, gt=0, le=7200)
    renew: bool = Field(
        default=False,
        description="extend the lease of a pause already held for `update_id` (no drain); "
        "the coordinator renews while its update runs",
    )
    policy_version: str | None = Field(
        default=None,
        max_length=256,
        description="the version being loaded: a peer whose lease runs out asks each engine "
        "whether it serves it",
    )
    checkpoint: str | None = None
    external: bool = Field(
        default=False,
        description="paused for an external hold: a peer whose lease runs out cannot ask the "
        "engines what the trainer loaded, so it labels them `unknown`",
    )


class PeerResume(StrictModel):
    """Body of `POST /policy/resume`: the update's outcome. `serving` (what each engine
    serves now) wins when given; else `policy_version` (all engines), and None keeps what
    this process served before. A process whose lease already resumed it still takes the
    outcome of that update."""

    update_id: str = Field(min_length=1, max_length=64)
    policy_version: str | None = Field(default=None, min_length=1, max_length=256)
    checkpoint: str | None = None
    serving: list[EngineServing] = Field(default_factory=list)


class PeerPaused(StrictModel):
    """Reply of `POST /policy/pause`: the process is paused and drained."""

    drained_calls: int = Field(description="engine calls that were in flight at the pause")
    drain_s: float


class PolicyUpdateRecord(StrictModel):
    """One update, as `GET /policy` lists it (newest last) and `POST /policy` and
    `POST /policy/release` return it. `kind`: `checkpoint` (the Gateway had every engine
    load a checkpoint) or `external` (a hold and release around the trainer's own sync;
    `checkpoint` is then None). `expired`: an external hold whose lease ran out."""

    update_id: str
    kind: Literal["checkpoint", "external"] = "checkpoint"
    policy_version: str = Field(
        description=f"the version updated to ({UNKNOWN_WEIGHTS!r}: an external update that "
        "named none)"
    )
    checkpoint: str | None
    previous_version: str | None
    status: Literal["ok", "failed", "unchanged", "expired"]
    error: str | None = None
    started_at: datetime
    processes: int = Field(description="gateway processes paused for the update (this one too)")
    drained_calls: int = Field(description="engine calls in flight at the pause, all finished")
    held_calls: int = Field(description="engine calls that waited at the pause (this process)")
    drain_s: float = Field(description="pause + drain of every process")
    load_s: float = Field(
        description="every engine loading the checkpoint (external: from the end of the "
        "drain to the release, the trainer's sync)"
    )
    total_s: float = Field(description="pause + drain + load + resume")
    engines: list[WeightUpdateReport] = Field(default_factory=list)
    serving: list[EngineServing] = Field(
        default_factory=list,
        description="what each engine serves after the update (empty in older records)",
    )


class PolicyState(StrictModel):
    """Reply of `GET /policy`. `policy_version` is the version every engine serves; None:
    no update yet (calls record their session's `policy_version` label), or the engines
    serve different weights after a failed update (`engines` says which)."""

    policy_version: str | None
    checkpoint: str | None
    updating: bool
    held_for: str | None = Field(
        default=None, description="the update_id of the external hold this process coordinates"
    )
    waiting_calls: int = Field(
        default=0,
        description="engine calls that came to this process's gate since it closed, all "
        "waiting (0 while it is open)",
    )
    engines: list[EngineServing] = Field(default_factory=list)
    history: list[PolicyUpdateRecord]
