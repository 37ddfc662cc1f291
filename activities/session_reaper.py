"""Worker-side session reaper: close gateway sessions whose workflow run has ended.

Why: a terminated workflow (or one past an execution timeout) never runs its `finally`,
so its session would stay open, token valid, until its TTL. Each rollout session names
its workflow run in its metadata (see `create_session`); the gateway-host worker lists
the open sessions of its gateway processes and closes those whose run is not running.
Sessions without those names (made by hand, or in another Temporal namespace) are left
to their TTL.
"""

import logging

import httpx
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.session import WORKFLOW_ID, WORKFLOW_NAMESPACE, WORKFLOW_RUN_ID, GatewayAccess
from gateway.control_client import GatewayControlError
from schemas.session import SessionListing

log = logging.getLogger("rollout.reaper")


async def close_orphan_sessions(client: Client, access: GatewayAccess) -> list[str]:
    """One pass over the open sessions of `access`'s gateways; returns the ids closed."""
    closed: list[str] = []
    seen: set[str] = set()  # processes on one data dir list the same sessions
    for url in access.urls:
        gateway = access.client(url)
        try:
            listing = await gateway.list_sessions()
        except (GatewayControlError, httpx.HTTPError) as exc:
            log.warning("reaper: cannot list sessions of %s: %r", url, exc)
            continue
        for session in listing.sessions:
            if session.session_id in seen:
                continue
            seen.add(session.session_id)
            run = _workflow_run(session, client.namespace)
            if run is None or await run_running(client, *run):
                continue
            try:
                await gateway.close_session(session.session_id)
            except GatewayControlError as exc:
                if exc.status != 404:  # 404: gone already, which is what we want
                    log.warning("reaper: cannot close session %s: %s", session.session_id, exc)
                    continue
            except httpx.HTTPError as exc:
                log.warning("reaper: cannot close session %s: %r", session.session_id, exc)
                continue
            closed.append(session.session_id)
    if closed:
        log.info("reaper closed %d session(s) of ended rollouts: %s", len(closed), closed)
    return closed


def _workflow_run(session: SessionListing, namespace: str) -> tuple[str, str] | None:
    """(workflow id, run id) of a rollout session of this namespace, else None."""
    meta = session.metadata
    workflow_id, run_id = meta.get(WORKFLOW_ID), meta.get(WORKFLOW_RUN_ID)
    if not isinstance(workflow_id, str) or not isinstance(run_id, str):
        return None
    if meta.get(WORKFLOW_NAMESPACE) != namespace:
        return None
    return workflow_id, run_id


async def run_running(client: Client, workflow_id: str, run_id: str) -> bool:
    """Whether that very run still runs (a rerun of the rollout is another run)."""
    try:
        desc = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as exc:
        return exc.status != RPCStatusCode.NOT_FOUND  # unsure: keep it
    return desc.status == WorkflowExecutionStatus.RUNNING
