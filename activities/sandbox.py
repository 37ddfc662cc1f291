"""provision_sandbox and destroy_sandbox (sandbox-host role), plus the host reaper.

Affinity: provision runs on the shared sandbox queue, so whichever host takes it
creates the sandbox; it returns this host's own queue, and every later activity for the
sandbox is pinned there. Backends are idempotent per rollout id (a retried create first
destroys the earlier one), and destroy treats "not found" as done.

A provision attempt that dies after creating (host crash, lost server) cannot report
its sandbox. So before creating, its first heartbeat — the one the SDK never throttles
— claims it (`SandboxClaim`: this host's queue, rollout id + attempt as labels); a
retry carries the claims on, and the workflow destroys each on its host by identity.
"""

import asyncio
import contextlib
import logging
import posixpath
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)

from activities.errors import bad_task
from activities.task_env import (
    EnvironmentUnavailable,
    ImageReady,
    prepare_image,
    refuse_unbuildable,
)
from sandboxes.base import (
    ROLLOUT_LABEL,
    BackendUnavailable,
    GatewayChannel,
    ImageRepo,
    SandboxBackend,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
)
from sandboxes.registry import backend_class, get_backend
from sandboxes.workspace.provisioning import resolve_path
from schemas.evaluation import SweBenchCheck
from schemas.rollout import (
    DESTROY_SANDBOX,
    PROVISION_SANDBOX,
    PROVISIONED_SANDBOXES,
    DestroyRequest,
    ProvisionRequest,
    SandboxClaim,
    SandboxRef,
)
from schemas.tasks import RolloutTask

log = logging.getLogger("rollout.activities.sandbox")
T = TypeVar("T")
#: Label carrying the rollout attempt a sandbox was made for: with the rollout id, what a
#: `SandboxClaim` names (a later attempt's sandbox on the same host is not the claimed one).
ATTEMPT_LABEL = "agentic-rollout.attempt"


def gateway_origin(session_url: str) -> str:
    """`http://h:p/prefix/v1` → `http://h:p`: what a sandbox's Gateway channel points at.

    Only the origin: the session URLs keep their whole path (prefix included) when they
    are rebased onto the sandbox's side of the channel (`harnesses.base.rebase_url`), so a
    prefix here would appear twice.
    """
    u = urlsplit(session_url)
    return urlunsplit((u.scheme, u.netloc, "", "", ""))


def gateway_channel(backend: str, session_url: str) -> GatewayChannel:
    """Host-local backends reach the Gateway through a bridge to its address; remote
    ones (e2b) use its public address directly."""
    origin = gateway_origin(session_url)
    if backend_class(backend).host_local:
        return GatewayChannel(target=origin)
    return GatewayChannel(public_url=origin)


async def with_heartbeat(aw: Awaitable[T], interval_s: float, details: Any = None) -> T:
    """Await `aw` while heartbeating, so a long create/destroy is seen as alive and
    can receive cancellation."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval_s)
            if done:
                return task.result()
            activity.heartbeat(details)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class SandboxBackends:
    """The backends this host offers, created lazily from per-backend settings."""

    def __init__(self, config: dict[str, dict[str, Any]] | None = None) -> None:
        self.config = config or {}
        self._backends: dict[str, SandboxBackend] = {}

    def get(self, name: str) -> SandboxBackend:
        if name not in self._backends:
            if self.config and name not in self.config:
                raise KeyError(f"backend {name!r} is not offered here: {sorted(self.config)}")
            self._backends[name] = get_backend(name, **self.config.get(name, {}))
        return self._backends[name]

    def active(self) -> list[SandboxBackend]:
        return list(self._backends.values())

    async def aclose(self) -> None:
        for backend in self._backends.values():
            with contextlib.suppress(Exception):
                await backend.close()


def build_spec(req: ProvisionRequest) -> SandboxSpec:
    """The sandbox for one attempt of a rollout (see `sandbox_spec`), labelled with it."""
    spec = sandbox_spec(req.task, req.rollout_id, req.session.openai_base_url, req.timeout_s)
    spec.labels[ATTEMPT_LABEL] = str(req.attempt)
    return spec


def sandbox_spec(
    task: RolloutTask, rollout_id: str, session_url: str, timeout_s: float
) -> SandboxSpec:
    """Task sandbox fields + what this rollout adds (id, TTL, Gateway channel, labels)."""
    fields = task.sandbox.spec_fields()
    labels = {**fields.pop("labels", {}), "agentic-rollout.task-id": task.task_id}
    labels[ROLLOUT_LABEL] = rollout_id
    spec = SandboxSpec.model_validate(
        {
            **fields,
            "rollout_id": rollout_id,
            "timeout_s": fields.get("timeout_s", timeout_s),
            "gateway": gateway_channel(task.sandbox.backend, session_url),
            "labels": labels,
        }
    )
    spec.image_repos += checked_image_repos(task, spec)
    return spec


def checked_image_repos(task: RolloutTask, spec: SandboxSpec) -> list[ImageRepo]:
    """The repos `swebench` checks name that the image holds (not the spec's own repo,
    nor one listed already): each is cut to its base commit's history at provision."""
    placed = {r.path for r in spec.image_repos}
    if spec.repo is not None:
        placed.add(posixpath.normpath(resolve_path(spec.repo.path, spec.workdir)))
    out: list[ImageRepo] = []
    for check in task.evaluation.checks if task.evaluation else ():
        if isinstance(check, SweBenchCheck):
            repo = ImageRepo(path=check.repo_path, commit=check.base_commit)
            if repo.path not in placed:
                placed.add(repo.path)
                out.append(repo)
    return out


class HostCapacity(CustomSlotSupplier):
    """Provision slot supplier: this host takes a provision task only while
    `live sandboxes + provisions in flight < max_live`.

    Why a slot supplier and not a wait inside the activity: the task then stays in the
    shared queue, where a host with room picks it up, and no timeout ticks meanwhile.
    `live` counts sandboxes provisioned here and not yet destroyed (re-synced from the
    backend by the reaper, which also catches sandboxes whose destroy never came).
    """

    def __init__(self, max_live: int, max_provisions: int) -> None:
        self.max_live = max_live
        self.max_provisions = max_provisions
        self.live = 0
        self.reserved = 0
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _room(self) -> bool:
        return self.live + self.reserved < self.max_live and self.reserved < self.max_provisions

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        self._loop = asyncio.get_running_loop()
        cond = self._cond()
        async with cond:
            await cond.wait_for(self._room)
            self.reserved += 1
        return SlotPermit()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        if not self._room():
            return None
        self.reserved += 1
        return SlotPermit()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        return None

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        self.reserved = max(0, self.reserved - 1)
        self._notify()

    def set_live(self, live: int) -> None:
        self.live = max(0, live)
        self._notify()

    def _notify(self) -> None:
        """Wake waiting reservations; safe from any thread (the SDK may call from one)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # nobody has waited yet
        cond = self._cond()

        async def wake() -> None:
            async with cond:
                cond.notify_all()

        loop.call_soon_threadsafe(lambda: loop.create_task(wake()))


class SandboxActivities:
    def __init__(
        self,
        backends: SandboxBackends,
        host_id: str,
        host_queue: str,
        capacity: HostCapacity | None = None,
        on_image: ImageReady | None = None,
    ) -> None:
        self.backends = backends
        self.host_id = host_id
        self.host_queue = host_queue
        self.capacity = capacity
        self.on_image = on_image

    def _backend(self, name: str) -> SandboxBackend:
        try:
            return self.backends.get(name)
        except KeyError as exc:
            raise bad_task("sandbox backend", exc) from exc
        except SandboxError as exc:  # this host cannot run it (e.g. bwrap missing)
            raise ApplicationError(str(exc), type="SandboxUnavailable") from exc

    @activity.defn(name=PROVISION_SANDBOX)
    async def provision_sandbox(self, req: ProvisionRequest) -> SandboxRef:
        """Create the sandbox. A retry that lands on another host than an earlier attempt
        (which may have created one, then crashed, timed out or failed) returns that
        attempt's claim in `earlier`, so the workflow destroys it now, not at its TTL."""
        earlier = earlier_sandboxes(activity.info().heartbeat_details)
        try:
            ref = await self._provision(req, earlier)
        except Exception as exc:
            if not earlier:
                raise
            raise _carrying(exc, earlier) from exc
        # Earlier sandboxes on this host are gone already: create is idempotent per rollout.
        others = [e for e in earlier if e.host_queue != self.host_queue]
        return ref.model_copy(update={"earlier": others})

    async def _provision(self, req: ProvisionRequest, earlier: list[SandboxClaim]) -> SandboxRef:
        try:
            spec = build_spec(req)
        except (ValidationError, ValueError) as exc:
            raise bad_task("sandbox spec", exc) from exc
        refuse_unbuildable(req.task)
        backend = self._backend(req.task.sandbox.backend)
        interval = _heartbeat_interval()
        claim = SandboxClaim(
            backend=backend.name,
            host=self.host_id,
            host_queue=self.host_queue,
            rollout_id=req.rollout_id,
            attempt=req.attempt,
        )
        # The attempt's first heartbeat, so never throttled: sent before create starts
        # (the yield hands it to the SDK), it outlives this attempt whatever happens next.
        creating = _beat("create", [*earlier, claim] if claim not in earlier else earlier)
        activity.heartbeat(creating)
        await asyncio.sleep(0)
        try:
            spec = await prepare_image(
                req.task,
                spec,
                lambda aw, s: with_heartbeat(aw, s, creating),
                interval,
                self.on_image,
            )
        except EnvironmentUnavailable as exc:
            raise ApplicationError(str(exc), type="SandboxUnavailable") from exc
        try:
            sandbox = await with_heartbeat(backend.create(spec), interval, creating)
        except BackendUnavailable as exc:
            raise ApplicationError(str(exc), type="SandboxUnavailable") from exc
        except (ValidationError, ValueError) as exc:
            raise bad_task("sandbox spec", exc) from exc
        except SandboxError as exc:
            raise ApplicationError(f"sandbox create failed: {exc}", type="SandboxError") from exc
        handle = sandbox.handle
        if self.capacity is not None:
            self.capacity.set_live(self.capacity.live + 1)
        activity.logger.info("sandbox %s for %s", handle.sandbox_id, req.rollout_id)
        return SandboxRef(
            backend=backend.name,
            sandbox_id=handle.sandbox_id,
            host=self.host_id,
            host_queue=self.host_queue,
            env_version=handle.env_version or "unknown",
            handle=handle.model_dump(mode="json"),
            facts=handle.facts,
        )

    @activity.defn(name=DESTROY_SANDBOX)
    async def destroy_sandbox(self, req: DestroyRequest) -> None:
        if req.claim is not None:
            await self._destroy_claimed(req.claim)
            return
        assert req.sandbox is not None  # DestroyRequest names exactly one
        handle = SandboxHandle.model_validate(req.sandbox.handle)
        backend = self._backend(req.sandbox.backend)
        with contextlib.suppress(SandboxNotFound):
            await with_heartbeat(backend.destroy(handle), _heartbeat_interval())
        if self.capacity is not None:
            self.capacity.set_live(self.capacity.live - 1)

    async def _destroy_claimed(self, claim: SandboxClaim) -> None:
        """Destroy what a failed provision attempt made here, found by its identity:
        the attempt died before it could say which sandbox it was (if it made one)."""
        backend = self._backend(claim.backend)
        interval = _heartbeat_interval()
        for handle in await with_heartbeat(backend.list(), interval):
            if _made_for(handle, claim):
                with contextlib.suppress(SandboxNotFound):
                    await with_heartbeat(backend.destroy(handle), interval)
                if self.capacity is not None:
                    self.capacity.set_live(self.capacity.live - 1)


def _made_for(handle: SandboxHandle, claim: SandboxClaim) -> bool:
    """Whether a listed sandbox is the one `claim` names (its rollout and attempt). Its
    labels: host-local backends keep them in the `labels` detail, e2b in `metadata`."""
    details = handle.details
    labels = {**(details.get("metadata") or {}), **(details.get("labels") or {})}
    return handle.rollout_id == claim.rollout_id and labels.get(ATTEMPT_LABEL) == str(claim.attempt)


def _beat(step: str, claims: list[SandboxClaim]) -> dict[str, Any]:
    return {"step": step, PROVISIONED_SANDBOXES: [c.model_dump(mode="json") for c in claims]}


def earlier_sandboxes(details: Any) -> list[SandboxClaim]:
    """The claims recorded in provision heartbeat (or error) details, oldest first."""
    out: list[SandboxClaim] = []
    for item in details or ():
        if isinstance(item, dict) and isinstance(item.get(PROVISIONED_SANDBOXES), list):
            for raw in item[PROVISIONED_SANDBOXES]:
                claim = SandboxClaim.model_validate(raw)
                if claim not in out:
                    out.append(claim)
    return out


def _carrying(exc: Exception, earlier: list[SandboxClaim]) -> ApplicationError:
    """`exc` as an ApplicationError that also carries `earlier` (in its details), so the
    workflow can release them when this was the provision's last attempt."""
    if isinstance(exc, ApplicationError):
        return ApplicationError(
            exc.message,
            *exc.details,
            _beat("failed", earlier),
            type=exc.type,
            non_retryable=exc.non_retryable,
        )
    return ApplicationError(str(exc) or type(exc).__name__, _beat("failed", earlier),
                            type=type(exc).__name__)  # fmt: skip


def _heartbeat_interval() -> float:
    timeout = activity.info().heartbeat_timeout
    return max(0.5, timeout.total_seconds() / 3) if timeout else 10.0


async def reap_orphans(
    client: Client, backends: SandboxBackends, capacity: HostCapacity | None = None
) -> list[str]:
    """Destroy this host's sandboxes whose rollout workflow is no longer running.

    Backs up `finally` for what it cannot cover (terminate, execution timeouts, a host
    that was down during cleanup), and re-syncs the host's live-sandbox count.
    """
    reaped: list[str] = []
    live = 0
    for backend in backends.active():
        try:
            handles = await backend.list()
        except SandboxError as exc:
            log.warning("reaper: cannot list %s sandboxes: %s", backend.name, exc)
            continue
        checked = frozenset(h.rollout_id for h in handles if h.rollout_id)
        active: set[str] = set()
        for rid in checked:
            if await _running(client, rid):
                active.add(rid)
        try:
            # only rollouts looked up above: a sandbox provisioned meanwhile is not an orphan
            reaped += await backend.reap(active, checked=checked)
            live += len([h for h in await backend.list() if h.rollout_id])
        except SandboxError as exc:
            log.warning("reaper: reap on %s failed: %s", backend.name, exc)
    if capacity is not None:
        capacity.set_live(live)
    if reaped:
        log.info("reaper reaped %d sandbox(es): %s", len(reaped), reaped)
    return reaped


async def _running(client: Client, rollout_id: str) -> bool:
    try:
        desc = await client.get_workflow_handle(rollout_id).describe()
    except RPCError as exc:
        return exc.status != RPCStatusCode.NOT_FOUND  # unsure: keep it
    return desc.status == WorkflowExecutionStatus.RUNNING
