"""The docker backend's run dir (bind-mounted at /run/rollout) is nobody else's to write.

The host acts in that dir (control socket, Gateway socket), so it must be writable
neither by other host users nor, once the supervisor is up, by the sandbox itself.
The non-root case runs a real non-root worker: the backend in a subprocess under an
unprivileged uid that is only in the docker group (system Python with the project's
venv packages on the path, since the venv's interpreter lives under /root). A sized
disk (`disk_mb`) needs root (loop mounts), so that worker asks for none; asked for one,
it refuses the create with `DiskLimitUnavailable` and leaves nothing behind.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import GatewayChannel, SandboxSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

REPO = Path(__file__).resolve().parents[2]
WORKER_UID = 4242

_WORKER = r"""
import asyncio, json, os, stat, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from sandboxes.base import GatewayChannel, ResourceLimits, SandboxSpec
from sandboxes.isolation.disk import DiskLimitUnavailable
from sandboxes.backends.docker import DockerBackend

class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("content-length", "5"); self.end_headers()
        self.wfile.write(b"hello")
    def log_message(self, *a):
        pass

async def main():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    b = DockerBackend(state_dir=sys.argv[1], image=sys.argv[2])
    gw = GatewayChannel(target=f"http://127.0.0.1:{srv.server_address[1]}")
    refused = None
    try:
        await b.create(SandboxSpec(rollout_id=sys.argv[3], gateway=gw))  # default disk_mb
    except DiskLimitUnavailable as e:
        refused = str(e)
    left = len(await b.list())
    no_disk = ResourceLimits(disk_mb=None)
    sb = await b.create(SandboxSpec(rollout_id=sys.argv[3], gateway=gw, resources=no_disk))
    try:
        st = os.stat(sb.state_dir / "run")
        get = "import urllib.request as u;print(u.urlopen('http://127.0.0.1:%d/').read().decode())"
        r = await sb.exec(["python3", "-c", get % gw.inside_port], timeout=30)
        plant = await sb.exec(["sh", "-c", "touch /run/rollout/planted"], timeout=30)
        out = {"uid": st.st_uid, "mode": stat.S_IMODE(st.st_mode), "gateway": r.stdout.strip(),
               "plant_rc": plant.exit_code, "euid": os.geteuid(), "refused": refused,
               "left_after_refusal": left}
    finally:
        await b.destroy(sb.handle)
        await b.close()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_non_root_worker_docker_run_dir_is_private(sandbox_base_image: Any) -> None:
    try:
        docker_gid = grp.getgrnam("docker").gr_gid
    except KeyError:
        pytest.fail("no `docker` group: the docker engine's socket must be group-accessible")
    state = Path(tempfile.mkdtemp(prefix="ar-nonroot-docker-", dir="/tmp"))
    os.chown(state, WORKER_UID, WORKER_UID)
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    try:
        r = subprocess.run(
            ["setpriv", f"--reuid={WORKER_UID}", f"--regid={WORKER_UID}",
             f"--groups={docker_gid}", "/usr/bin/python3", "-c", _WORKER,
             str(state / "docker"), sandbox_base_image.tag, f"test-{uuid.uuid4().hex[:8]}"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(state), "PYTHONPATH": f"{REPO}:{site}"},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(state)
    assert out == {
        "uid": WORKER_UID,
        "mode": 0o750,
        "gateway": "hello",
        "plant_rc": 1,
        "euid": WORKER_UID,
        "refused": "resources.disk_mb=4096 cannot be enforced on this host: it needs root "
        "(loop devices and mount); run the worker as root or set disk_mb to null "
        "(no disk limit)",
        "left_after_refusal": 0,
    }


async def test_root_worker_docker_run_dir_is_sealed_after_start(
    docker_backend: Any, loopback_http_server: str
) -> None:
    assert os.geteuid() == 0, "this test covers the root worker"
    gw = GatewayChannel(target=loopback_http_server)
    sb = await docker_backend.create(
        SandboxSpec(rollout_id=f"test-{uuid.uuid4().hex[:8]}", gateway=gw)
    )
    try:
        st = os.stat(sb.state_dir / "run")
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o750)
        plant = await sb.exec(["sh", "-c", "touch /run/rollout/planted"], timeout=30)
        assert plant.exit_code == 1
        get = f"import urllib.request as u;print(u.urlopen('http://127.0.0.1:{gw.inside_port}/x').read().decode())"
        r = await sb.exec(["python3", "-c", get], timeout=30)
        assert json.loads(r.stdout)["path"] == "/x"
    finally:
        await sb.destroy()
