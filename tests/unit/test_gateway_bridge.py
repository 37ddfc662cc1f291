"""The host-side Gateway bridge socket, in a run dir the sandbox can write.

The sandbox may replace anything in its run dir at any moment, so the bridge must never
act by path there: a symlink planted right after the socket is bound must not redirect
the chmod that makes the socket usable to a host file.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sandboxes.network.gateway_channel import close_bridge, ensure_bridge


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


def _get_over_unix(path: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(10)
        c.connect(path)
        c.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def test_symlink_planted_after_bind_cannot_redirect_the_chmod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"  # the sandbox-writable run dir; tmp_path plays the state dir
    run.mkdir()
    victim = tmp_path / "host-secret"
    victim.write_text("secret")
    victim.chmod(0o600)
    listen = run / "gateway.sock"
    real_bind = socket.socket.bind

    def bind_then_sandbox_plants_symlink(self: socket.socket, addr: Any) -> None:
        real_bind(self, addr)
        if (
            self.family == socket.AF_UNIX
            and isinstance(addr, str)
            and addr.startswith(str(tmp_path))
        ):
            # The sandbox wins the race: whatever is at the socket's name becomes a link.
            if listen.exists() or listen.is_symlink():
                listen.unlink()
            listen.symlink_to(victim)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with monkeypatch.context() as m:
            m.setattr(socket.socket, "bind", bind_then_sandbox_plants_symlink)
            ensure_bridge(str(listen), f"http://127.0.0.1:{srv.server_address[1]}")
        assert stat.S_IMODE(victim.stat().st_mode) == 0o600
        assert victim.read_text() == "secret"
        st = os.lstat(listen)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o666
        assert _get_over_unix(str(listen)).endswith(b"hello")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["host-secret", "run"]
    finally:
        close_bridge(str(listen))
        srv.shutdown()
        srv.server_close()
    assert not os.path.lexists(listen)
