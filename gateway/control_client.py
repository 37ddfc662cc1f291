"""Typed client for the Gateway control API (used by activities, tests, benches, the demo)."""

from types import TracebackType

import httpx

from schemas.session import SessionConfig, SessionCreated, SessionList, SessionSummary
from schemas.trajectory import Trajectory


class GatewayControlError(RuntimeError):
    """The control API answered with an error; carries the status and the error's `code`
    (the gateway's error kind, e.g. `conflict`) for retry decisions."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"gateway control API {status}: {message}")
        self.status = status
        self.code = code


class GatewayControlClient:
    def __init__(self, base_url: str, admin_token: str | None = None, timeout_s: float = 60.0):
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s
        )

    @staticmethod
    def _check(reply: httpx.Response) -> httpx.Response:
        if reply.is_success:
            return reply
        try:
            error = reply.json()["error"]
            message = str(error["message"])
            code = error.get("code")
        except (ValueError, KeyError, TypeError, AttributeError):
            message, code = reply.text[:500], None
        raise GatewayControlError(
            reply.status_code, message, code if isinstance(code, str) else None
        )

    async def create_session(self, config: SessionConfig) -> SessionCreated:
        reply = await self._http.post(
            "/sessions",
            content=config.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        return SessionCreated.model_validate_json(self._check(reply).content)

    async def list_sessions(self) -> SessionList:
        """The open sessions on the gateway's data dir."""
        reply = await self._http.get("/sessions")
        return SessionList.model_validate_json(self._check(reply).content)

    async def summary(self, session_id: str) -> SessionSummary:
        reply = await self._http.get(f"/sessions/{session_id}")
        return SessionSummary.model_validate_json(self._check(reply).content)

    async def trajectory(self, session_id: str) -> Trajectory:
        reply = await self._http.get(f"/sessions/{session_id}/trajectory")
        return Trajectory.model_validate_json(self._check(reply).content)

    async def close_session(self, session_id: str) -> None:
        self._check(await self._http.delete(f"/sessions/{session_id}"))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "GatewayControlClient":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class GatewayControlClients:
    """One `GatewayControlClient` per gateway control URL, kept for a worker's life: a new
    httpx client per request builds a TLS context each time (≈ 60 ms of CPU)."""

    def __init__(self, admin_token: str | None, timeout_s: float = 60.0) -> None:
        self.admin_token = admin_token
        self.timeout_s = timeout_s
        self._clients: dict[str, GatewayControlClient] = {}

    def client(self, url: str) -> GatewayControlClient:
        url = url.rstrip("/")
        if url not in self._clients:
            self._clients[url] = GatewayControlClient(url, self.admin_token, self.timeout_s)
        return self._clients[url]

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()
