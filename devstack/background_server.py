"""Run an ASGI app on a loopback port in a background thread (tests, the demo, benches).

Binding the socket ourselves (port 0) gives a free port without the race of asking for
one and hoping it is still free when uvicorn binds it.
"""

import asyncio
import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn


class BackgroundServer:
    """Context manager: `with BackgroundServer(app) as srv: httpx.get(srv.url + "/health")`.

    `add` serves another app from the same thread and event loop, on its own port: the
    Gateway's agent and control listeners share one core, whose asyncio state belongs to
    one loop.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn_options: Any
    ) -> None:
        """`uvicorn_options`: more `uvicorn.Config` settings (e.g. `http`), for every app
        this server serves."""
        self.app = app
        self.host = host
        self._options = uvicorn_options
        self._listeners: list[tuple[uvicorn.Server, socket.socket]] = []
        self.port = self._listen(app, host, port)
        self._thread = threading.Thread(target=self._run, name=f"server:{self.port}", daemon=True)

    def _listen(self, app: Any, host: str, port: int) -> int:
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP;
        # without it every reply waits ~40 ms for Nagle's algorithm and the delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # lifespan: apps start their background tasks (the gateway's session reaper) with it
        options = {"log_level": "warning", "lifespan": "auto", "timeout_keep_alive": 30}
        config = uvicorn.Config(app, **{**options, **self._options})
        self._listeners.append((uvicorn.Server(config), sock))
        return int(sock.getsockname()[1])

    def add(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve `app` too (call before `start`); returns its URL."""
        if self._thread.is_alive():
            raise RuntimeError("add listeners before start()")
        return f"http://{host}:{self._listen(app, host, port)}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        async def serve_all() -> None:
            await asyncio.gather(*(srv.serve(sockets=[sock]) for srv, sock in self._listeners))

        asyncio.run(serve_all())

    def start(self, timeout_s: float = 10.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not all(srv.started for srv, _ in self._listeners):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        for srv, _ in self._listeners:
            srv.should_exit = True
        self._thread.join(timeout=10)
        for _, sock in self._listeners:
            sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
