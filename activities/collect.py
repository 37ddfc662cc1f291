"""collect_trajectory: Gateway records → training samples (Parquet) → a reference.

Runs on the gateway host that owns the session. It first closes the session, so no late
call (a stray agent child) can change the trajectory after it was read; closing is
idempotent and the records stay readable. The samples file is keyed by rollout id and
written atomically, so a retried collect replaces rather than duplicates.
"""

import asyncio

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.samples import build_rows, summarize
from activities.sandbox import with_heartbeat
from activities.session import GatewayAccess, control_error
from gateway.control_client import GatewayControlError
from rollout_client.storage import write_table
from schemas.rollout import COLLECT_TRAJECTORY, CollectRequest, SamplesSummary
from schemas.samples import rows_to_table, samples_uri


class CollectActivities:
    def __init__(self, access: GatewayAccess) -> None:
        self.access = access

    @activity.defn(name=COLLECT_TRAJECTORY)
    async def collect_trajectory(self, req: CollectRequest) -> SamplesSummary:
        """Heartbeats throughout, so a worker that dies mid-collect is seen at once."""
        timeout = activity.info().heartbeat_timeout
        interval = timeout.total_seconds() / 3 if timeout else 10.0
        return await with_heartbeat(self._collect(req), max(0.5, interval))

    async def _collect(self, req: CollectRequest) -> SamplesSummary:
        client = self.access.client(req.session.gateway_url)
        session_id = req.session.session_id
        try:
            await client.close_session(session_id)
            traj = await client.trajectory(session_id)
        except GatewayControlError as exc:
            raise control_error("read trajectory", exc) from exc
        except httpx.HTTPError as exc:
            msg = f"gateway unreachable: {exc!r}"
            raise ApplicationError(msg, type="GatewayUnavailable") from exc
        if traj.rollout_id != req.rollout_id:
            raise ApplicationError(
                f"session {session_id} belongs to {traj.rollout_id}, not {req.rollout_id}",
                non_retryable=True,
                type="SessionMismatch",
            )
        rows = build_rows(traj, req)
        expected = req.outcome.llm_calls
        if expected is not None and expected > len(traj.calls):
            activity.logger.warning(
                "%s: agent made %d calls but the gateway holds %d",
                req.rollout_id,
                expected,
                len(traj.calls),
            )
        uri = None
        if rows:
            uri = samples_uri(req.output, req.rollout_id)
            await asyncio.to_thread(write_table, rows_to_table(rows), uri)
        return summarize(traj, rows, uri, closed=True)
