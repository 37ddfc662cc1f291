"""Free loopback ports for the services tests, benchmarks and the demo start."""

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (bound, then released).

    Another process may take it before the caller binds it; callers that can, bind port
    0 themselves (see :class:`devstack.background_server.BackgroundServer`).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def consecutive_free_ports(count: int, host: str = "127.0.0.1") -> int:
    """A base port such that base..base+count-1 are all free right now: `rollout gateway
    --processes N` takes N consecutive ports from its `--port` (and `--control-port`)."""
    for _ in range(200):
        base = free_port(host)
        socks: list[socket.socket] = []
        try:
            for offset in range(count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no run of free ports found")
