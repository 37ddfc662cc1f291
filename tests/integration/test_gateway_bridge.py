"""The host-side Gateway bridge keeps relaying after the sandbox side half-closes, even
when a full garbage collection runs meanwhile (loopback TCP upstream made by the test)."""

import gc
import socket
import time
from pathlib import Path

import pytest

from sandboxes.network.gateway_channel import close_bridge, ensure_bridge

pytestmark = pytest.mark.integration


def test_the_reply_after_a_half_close_survives_a_full_gc(tmp_path: Path) -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    port = upstream.getsockname()[1]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    listen = str(run_dir / "gateway.sock")
    ensure_bridge(listen, f"tcp://127.0.0.1:{port}")
    try:
        agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        agent.settimeout(10)
        agent.connect(listen)
        agent.sendall(b"request")
        agent.shutdown(socket.SHUT_WR)  # the agent is done sending; it waits for the reply
        upstream.settimeout(10)
        conn, _ = upstream.accept()
        conn.settimeout(10)
        got = b""
        while not got.endswith(b"request"):
            got += conn.recv(100)
        assert conn.recv(100) == b""  # the half-close was relayed
        time.sleep(0.2)
        gc.collect()  # the relay's task must not be reachable only through a cycle
        time.sleep(0.2)
        conn.sendall(b"reply")
        conn.close()
        received = b""
        while chunk := agent.recv(100):
            received += chunk
        assert received == b"reply"
        agent.close()
    finally:
        close_bridge(listen)
        upstream.close()
