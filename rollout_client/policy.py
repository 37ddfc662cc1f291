"""The trainer's side of the Gateway's policy-update control call (`POST /policy`,
`GET /policy`): publish a checkpoint as the new policy version, read the update history.

Why apart from the models (`schemas.policy`): the Gateway serves the same bodies, and
it must not need an HTTP client to know them; the trainer needs both.
"""

import httpx

from schemas.policy import PolicyState, PolicyUpdate, PolicyUpdateRecord


class PolicyUpdateError(RuntimeError):
    """`POST /policy` failed: the status, the gateway's error kind (`code`: `forbidden`
    for a checkpoint outside its roots, `engine_bad_reply` for a failed load, ...) and
    its message, which ends with what the engines serve after the failure."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"policy update failed ({status}): {message}")
        self.status = status
        self.code = code


class GatewayPolicyClient:
    """The trainer's side of the call: one control URL (any gateway process)."""

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
            raise PolicyUpdateError(reply.status_code, _message(reply))
        return PolicyState.model_validate_json(reply.content)

    async def update(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:
            reply = await client.post(f"{self.control_url}/policy", json=update.model_dump())
        if reply.status_code != 200:
            raise PolicyUpdateError(reply.status_code, _message(reply), _code(reply))
        return PolicyUpdateRecord.model_validate_json(reply.content)


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
