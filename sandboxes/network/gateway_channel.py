"""Host side of the Gateway channel: a Unix socket that forwards to the Gateway.

Why: local and docker sandboxes have no network route at all. The only way out is a
Unix socket bind-mounted into the sandbox; the in-sandbox supervisor forwards
``127.0.0.1:PORT`` to it. When the Gateway itself listens on TCP, this module runs the
small host-side bridge ``unix socket -> gateway host:port``. Bridges live on one
background event loop per process (so they work from any caller loop or thread, and
opening one costs well under a millisecond — it is on the warm-acquire path).
If the owning process dies the socket stops answering; `ensure_bridge` (called by the
backends' `attach`) re-opens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any
from urllib.parse import urlparse

#: Opens the upstream of one relayed connection (raises OSError when it cannot).
Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def parse_target(target: str) -> tuple[str, Any]:
    """``unix:/p`` → ("unix", "/p"); ``http://h:p`` or ``tcp://h:p`` → ("tcp", (h, p))."""
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        return "unix", path
    u = urlparse(target if "://" in target else f"tcp://{target}")
    if not u.hostname or not u.port:
        raise ValueError(f"gateway target needs host and port: {target!r}")
    return "tcp", (u.hostname, u.port)


async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            w.write_eof()


def _bind_in_place(listen_path: str, mode: int) -> socket.socket:
    """A Unix socket bound at `listen_path` with `mode`, never touching anything else.

    Why: the listen dir is the sandbox's run dir, which the sandbox can write. A chmod
    by path there follows whatever the sandbox put at that name in the meantime (a
    symlink to a host file). So the socket is bound and chmod-ed in a fresh private
    dir next to the run dir (its parent, the host-only state dir) and then renamed
    into place: rename replaces a planted symlink instead of following it.
    """
    listen_path = os.path.abspath(listen_path)
    stage = tempfile.mkdtemp(prefix=".b-", dir=os.path.dirname(os.path.dirname(listen_path)))
    staged = os.path.join(stage, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(staged)
        os.chmod(staged, mode)
        os.rename(staged, listen_path)
    except BaseException:
        sock.close()
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.rmdir(stage)
    return sock


class _Hub:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._servers: dict[str, tuple[asyncio.AbstractServer, str]] = {}
        #: The relays in flight, held here: once the sandbox side has sent EOF its
        #: transport leaves the selector and the upstream protocol holds its reader only
        #: weakly, so a relay still waiting for the reply is a cycle nothing else refers
        #: to; a full GC collected it mid-reply (reply lost, "Task was destroyed but it is
        #: pending!" in the worker's log).
        self._relays: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()
        t = threading.Thread(target=self._loop.run_forever, name="gateway-bridges", daemon=True)
        t.start()

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout=30)

    async def _open(self, listen_path: str, key: str, connect: Connector, mode: int) -> None:
        old = self._servers.get(listen_path)
        if old is not None:
            if old[1] == key and os.path.exists(listen_path):
                return
            old[0].close()

        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            relay = asyncio.current_task()
            assert relay is not None
            self._relays.add(relay)
            relay.add_done_callback(self._relays.discard)
            try:
                ur, uw = await connect()
            except OSError:
                w.close()
                return
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
            uw.close()
            w.close()

        srv = await asyncio.start_unix_server(on_conn, sock=_bind_in_place(listen_path, mode))
        self._servers[listen_path] = (srv, key)

    async def _close(self, listen_path: str) -> None:
        old = self._servers.pop(listen_path, None)
        if old is not None:
            old[0].close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen_path)

    def open(self, listen_path: str, key: str, connect: Connector, mode: int = 0o666) -> None:
        self._call(self._open(listen_path, key, connect, mode))

    def close(self, listen_path: str) -> None:
        self._call(self._close(listen_path))

    def is_open(self, listen_path: str) -> bool:
        return listen_path in self._servers and os.path.exists(listen_path)


_HUB: _Hub | None = None
_HUB_LOCK = threading.Lock()


def _hub() -> _Hub:
    global _HUB
    with _HUB_LOCK:
        if _HUB is None:
            _HUB = _Hub()
        return _HUB


def ensure_bridge(listen_path: str, target: str, mode: int = 0o666) -> None:
    """Serve `listen_path` (Unix socket) forwarding every connection to `target`.

    The socket's dir may be writable by the sandbox; its parent must not be (the
    socket is prepared there, see `_bind_in_place`).
    """
    kind, addr = parse_target(target)

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if kind == "unix":
            return await asyncio.open_unix_connection(addr)
        return await asyncio.open_connection(*addr)

    _hub().open(listen_path, target, connect, mode)


def ensure_relay(listen_path: str, key: str, connect: Connector, mode: int = 0o666) -> None:
    """Serve `listen_path` relaying every connection to what `connect` opens.

    The general form of `ensure_bridge` (the egress relay decides per connection where
    to connect); `key` names the destination, so re-opening with the same key is a
    no-op. `connect` runs on the bridges' loop and signals refusal with OSError.
    """
    _hub().open(listen_path, key, connect, mode)


def close_bridge(listen_path: str) -> None:
    """Stop serving `listen_path` (idempotent; safe when never opened here)."""
    if _HUB is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen_path)
        return
    _hub().close(listen_path)


def bridge_is_open(listen_path: str) -> bool:
    return _HUB is not None and _HUB.is_open(listen_path)
