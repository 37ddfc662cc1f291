"""Gateway session activities: create_session and close_session (gateway-host role).

Why they run on the gateway host: the worker sits next to the gateway processes it was
given, opens sessions on them (round-robin: one process saturates on tokenization) and
returns its own *owner queue*, so collect/close for that session come back here and read
the trajectory locally.
"""

import itertools
import logging

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.errors import agent_config_error, bad_task
from gateway.control_client import (
    GatewayControlClient,
    GatewayControlClients,
    GatewayControlError,
)
from schemas.rollout import (
    CLOSE_SESSION,
    CREATE_SESSION,
    CloseSessionRequest,
    SessionRef,
    SessionRequest,
)
from schemas.scenes import SceneConfig
from schemas.session import MAX_TTL_S, SessionConfig

log = logging.getLogger("rollout.activities.session")

#: Session metadata naming the workflow run that owns a session (read by the reaper).
WORKFLOW_ID, WORKFLOW_RUN_ID, WORKFLOW_NAMESPACE = (
    "workflow_id",
    "workflow_run_id",
    "workflow_namespace",
)
TTL_SLACK_S = 60.0
"""Margin on the TTLs for clock skew between the workflow's timers and the gateway."""


class GatewayAccess:
    """Control-API clients for this host's gateway processes (admin token included).
    `gateway_urls` are the control listeners; the agent URLs come back in SessionCreated."""

    def __init__(self, gateway_urls: list[str], admin_token: str | None, owner_queue: str):
        if not gateway_urls:
            raise ValueError("gateway-host role needs at least one --gateway URL")
        self.urls = [u.rstrip("/") for u in gateway_urls]
        self.admin_token = admin_token
        self.owner_queue = owner_queue
        self._clients = GatewayControlClients(admin_token)
        self._next = itertools.cycle(self.urls)

    def client(self, url: str) -> GatewayControlClient:
        return self._clients.client(url)

    def pick(self) -> str:
        return next(self._next)

    async def aclose(self) -> None:
        await self._clients.aclose()


def scene_config_for(req: SessionRequest) -> SceneConfig:
    """The task's scene policy, else the harness's own profile (data shipped with it)."""
    if req.scenes is not None:
        return req.scenes
    from harnesses.registry import get_harness

    try:
        harness = get_harness(req.harness.name, req.harness.config)
    except KeyError as exc:
        raise bad_task("unknown harness", exc) from exc
    except ValueError as exc:
        raise agent_config_error(f"harness {req.harness.name} config", exc) from exc
    return harness.scene_config()


def session_ttls(req: SessionRequest) -> tuple[float, float]:
    """(idle, absolute) TTL of a rollout's session, from the task's budget.

    Absolute: no agent call is legitimate after the whole budget plus its grace (the
    workflow's backstop timer stops the agent by then). Idle: the longest silence of a
    live rollout is bounded by what comes before the agent's first call (provisioning,
    harness setup, before_run hooks) plus the agent's whole budget (one long command).
    """
    b = req.budget
    absolute = min(b.total_s + b.grace_s + TTL_SLACK_S, MAX_TTL_S)
    before_first_call = b.provision_s + b.setup_s + b.hooks_s
    idle = before_first_call + req.harness.budget_s + b.grace_s + TTL_SLACK_S
    return min(idle, absolute), absolute


def idempotency_key(rollout_id: str, run_id: str, attempt: int) -> str:
    """One key per workflow run and attempt: a rerun or reset of the rollout (new run id)
    gets a new session, a retried create of the same attempt the same one. Run id and
    attempt come first, so cutting a long rollout id to the field's limit stays unique."""
    return f"{run_id}/attempt-{attempt}/{rollout_id}"[:256]


def control_error(step: str, exc: GatewayControlError) -> ApplicationError:
    """Which gateway answers a retry can fix.

    Retryable: 5xx, 408, 429, and a 409 `conflict` — a state that passes or that a new
    attempt gets past (a session served by another process, closed or expired). Not
    retryable: a key reused with another config (409 `idempotency_mismatch`) and every
    other 4xx: the request itself is wrong.
    """
    conflict = exc.status == 409 and exc.code != "idempotency_mismatch"
    if exc.status >= 500 or exc.status in (408, 429) or conflict:
        return ApplicationError(f"{step}: {exc}", type="GatewayUnavailable")
    return bad_task(step, exc)


class SessionActivities:
    def __init__(self, access: GatewayAccess) -> None:
        self.access = access

    @activity.defn(name=CREATE_SESSION)
    async def create_session(self, req: SessionRequest) -> SessionRef:
        info = activity.info()
        idle_ttl, absolute_ttl = session_ttls(req)
        config = SessionConfig(
            rollout_id=req.rollout_id,
            policy_version=req.policy_version,
            sampling=req.sampling,
            sampling_control=req.sampling_control,
            scenes=scene_config_for(req),
            metadata={
                **req.metadata,
                "harness": req.harness.name,
                WORKFLOW_ID: info.workflow_id,
                WORKFLOW_RUN_ID: info.workflow_run_id,
                WORKFLOW_NAMESPACE: info.workflow_namespace,
            },
            # A retried create (worker died after the gateway answered, or the retry went
            # to another gateway process) gets the same session back, not an orphan.
            idempotency_key=idempotency_key(req.rollout_id, info.workflow_run_id, req.attempt),
            idle_ttl_s=idle_ttl,
            absolute_ttl_s=absolute_ttl,
        )
        url = self.access.pick()
        try:
            created = await self.access.client(url).create_session(config)
        except GatewayControlError as exc:
            raise control_error("create session", exc) from exc
        except httpx.HTTPError as exc:
            msg = f"gateway {url} unreachable: {exc!r}"
            raise ApplicationError(msg, type="GatewayUnavailable") from exc
        activity.logger.info("session %s for %s on %s", created.session_id, req.rollout_id, url)
        return SessionRef(
            session_id=created.session_id,
            token=created.token,
            openai_base_url=created.openai_base_url,
            anthropic_base_url=created.anthropic_base_url,
            gateway_url=url,
            owner_queue=self.access.owner_queue,
        )

    @activity.defn(name=CLOSE_SESSION)
    async def close_session(self, req: CloseSessionRequest) -> None:
        """Idempotent: an unknown session counts as closed."""
        try:
            await self.access.client(req.session.gateway_url).close_session(req.session.session_id)
        except GatewayControlError as exc:
            if exc.status == 404:
                return
            raise control_error("close session", exc) from exc
