"""The trainer's side of the Gateway's policy-update control calls: publish a checkpoint as
the new policy version (`POST /policy`), or hold the Gateway around a weight sync the
trainer does itself (`POST /policy/hold`, `/policy/release`), and read the history.

Why apart from the models (`schemas.policy`): the Gateway serves the same bodies, and
it must not need an HTTP client to know them; the trainer needs both.
"""

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from pydantic import BaseModel

from schemas.policy import (
    PolicyHeld,
    PolicyHold,
    PolicyRelease,
    PolicyState,
    PolicyUpdate,
    PolicyUpdateRecord,
)

log = logging.getLogger("rollout.client")


class PolicyUpdateError(RuntimeError):
    """A policy call failed: the status, the gateway's error kind (`code`: `forbidden`
    for a checkpoint outside its roots, `engine_bad_reply` for a failed load, `conflict`
    for an update or hold while another runs, ...) and its message, which ends with what
    the engines serve after the failure."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"policy update failed ({status}): {message}")
        self.status = status
        self.code = code


@dataclass
class ExternalUpdate:
    """The hold of one `GatewayPolicyClient.external_update`. Inside the block: set
    `touched = False` before raising when the sync failed before changing any weight (the
    previous version then keeps serving); change `policy_version` if the sync ended on
    another one. After a clean exit, `record` is the history entry."""

    held: PolicyHeld
    policy_version: str
    touched: bool = True
    record: PolicyUpdateRecord | None = None


class GatewayPolicyClient:
    """The trainer's side of the calls: one control URL (any gateway process; a hold's
    release goes to the process that took the hold)."""

    def __init__(
        self, control_url: str, admin_token: str | None = None, timeout_s: float = 3600.0
    ) -> None:
        self.control_url = control_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.timeout_s = timeout_s

    async def state(self) -> PolicyState:
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:
            reply = await client.get(f"{self.control_url}/policy")
        if reply.status_code != 200:
            raise PolicyUpdateError(reply.status_code, _message(reply), _code(reply))
        return PolicyState.model_validate_json(reply.content)

    async def _post(self, path: str, body: BaseModel) -> bytes:
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:
            reply = await client.post(f"{self.control_url}{path}", json=body.model_dump())
        if reply.status_code != 200:
            raise PolicyUpdateError(reply.status_code, _message(reply), _code(reply))
        return reply.content

    async def update(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        """Every engine loads `update.checkpoint` (pause, drain, load, resume)."""
        return PolicyUpdateRecord.model_validate_json(await self._post("/policy", update))

    async def hold(self, hold: PolicyHold) -> PolicyHeld:
        """Pause and drain every gateway process; returns once no engine call is in
        flight. End it with `release` within `hold.lease_s`."""
        return PolicyHeld.model_validate_json(await self._post("/policy/hold", hold))

    async def release(self, release: PolicyRelease) -> PolicyUpdateRecord:
        """End a hold: the engines serve `release.policy_version` (or the sync failed);
        every gateway process resumes, labelling calls with it."""
        return PolicyUpdateRecord.model_validate_json(await self._post("/policy/release", release))

    @contextlib.asynccontextmanager
    async def external_update(
        self,
        policy_version: str,
        *,
        drain_timeout_s: float = 600.0,
        lease_s: float = 600.0,
        update_id: str | None = None,
    ) -> AsyncIterator[ExternalUpdate]:
        """Hold the Gateway while the block syncs weights into the engines; release with
        `policy_version` when the block ends, or with its error when it raises (the error
        is raised on; a release that fails then is logged, and the hold's lease ends it)::

            async with policy.external_update("step-7"):
                await sync_weights_to_engines()   # the trainer's own NCCL/IPC sync
        """
        hold = PolicyHold(
            update_id=update_id or f"ext-{uuid.uuid4().hex[:12]}",
            policy_version=policy_version,
            drain_timeout_s=drain_timeout_s,
            lease_s=lease_s,
        )
        update = ExternalUpdate(held=await self.hold(hold), policy_version=policy_version)
        try:
            yield update
        except BaseException as exc:
            failed = PolicyRelease(
                update_id=hold.update_id,
                policy_version=update.policy_version,
                error=f"{type(exc).__name__}: {exc}"[:2000],
                touched=update.touched,
            )
            try:
                await self.release(failed)
            except Exception as release_error:  # the sync's error is the one to raise
                log.error("external update %s: release failed: %r", hold.update_id, release_error)
            raise
        update.record = await self.release(
            PolicyRelease(update_id=hold.update_id, policy_version=update.policy_version)
        )


def _message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return reply.text[:500]


def _code(reply: httpx.Response) -> str | None:
    try:
        code = reply.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None
