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
