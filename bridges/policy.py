"""Publishing a trainer's new policy through the Gateway, one way for every bridge.

`POST /policy` pauses new calls, drains running ones, has every engine load the
checkpoint and resumes; the version the Gateway then serves labels the next rollouts and
is the trainer's current version for the staleness rule.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollout_client.policy import GatewayPolicyClient
from schemas.policy import PolicyUpdate, PolicyUpdateRecord
from schemas.training import policy_version_index

ADMIN_TOKEN_ENV = "ROLLOUT_ADMIN_TOKEN"
"""Where a bridge configured by its trainer (no constructor of ours) finds the admin token."""


def gateway_policy(url: str, admin_token: str | None = None) -> GatewayPolicyClient:
    """The Gateway's policy client; the token from `ROLLOUT_ADMIN_TOKEN` unless given."""
    token = admin_token if admin_token is not None else os.environ.get(ADMIN_TOKEN_ENV)
    return GatewayPolicyClient(url, token)


async def served_version(gateway: GatewayPolicyClient) -> str | None:
    """The version the Gateway's engines serve (None: none labelled yet)."""
    return (await gateway.state()).policy_version


async def served_index(gateway: GatewayPolicyClient) -> int | None:
    """The served version's index (`policy_version_index`), None without one."""
    version = await served_version(gateway)
    return policy_version_index(version) if version else None


async def publish(
    gateway: GatewayPolicyClient,
    version: str,
    checkpoint: str | Path,
    *,
    unless_served: bool = False,
) -> PolicyUpdateRecord | None:
    """Have the Gateway's engines serve `checkpoint` as `version`; returns when they do.
    `unless_served`: nothing to do when the Gateway serves `version` already (a resumed
    run publishing the step it stopped at); None then."""
    if unless_served and await served_version(gateway) == version:
        return None
    update = PolicyUpdate(policy_version=version, checkpoint=str(Path(checkpoint).resolve()))
    return await gateway.update(update)
