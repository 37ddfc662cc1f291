"""Assemble and serve a Gateway process (or N of them, one port each).

One process saturates on tokenization; N processes each own the sessions created on them
(the base URL handed to the agent names the owning process), sharing only the data dir.
"""

import ipaddress
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Literal

import httpx
import uvicorn
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette

from gateway.app import GatewayApp
from gateway.chat_template import ChatTemplate
from gateway.core import Gateway, GatewayOptions
from gateway.engine_client import EngineClient
from gateway.incremental import IncrementalTokenizer, load_tokenizer
from gateway.model_files import load_model_files
from gateway.output_parser import get_parser

log = logging.getLogger("rollout.gateway")


class GatewaySettings(BaseModel):
    """Everything `rollout gateway` accepts, validated before anything starts."""

    model_config = ConfigDict(extra="forbid")

    engine_urls: list[str] = Field(min_length=1)
    model: str
    tokenizer: Path
    chat_template: Path | None = None
    parser: str = "qwen3"
    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    public_url: str | None = None
    data_dir: Path = Path("./data/gateway")
    admin_token: str | None = None
    insecure_dev: bool = False
    context_window: int | None = None
    request_timeout_s: float = 600.0
    max_body_bytes: int = 32 * 2**20
    fsync: Literal["group", "off"] = "group"
    fsync_interval_ms: float = Field(default=5.0, gt=0, le=1000)
    session_janitor_interval_s: float = Field(default=30.0, ge=0)


def check_admin_policy(settings: GatewaySettings) -> None:
    """Running without an admin token is allowed only on loopback with --insecure-dev, where
    every control call is allowed."""
    if settings.admin_token:
        return
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if not (settings.insecure_dev and loopback):
        raise SystemExit(
            "refusing to start: set --admin-token or ROLLOUT_ADMIN_TOKEN "
            "(or bind to loopback with --insecure-dev)"
        )


def engine_context_window(url: str, model: str) -> int | None:
    """Ask the engine for max_model_len so max_tokens can be capped by the real window."""
    try:
        reply = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    for entry in reply.get("data", []):
        if isinstance(entry, dict) and isinstance(entry.get("max_model_len"), int):
            return int(entry["max_model_len"])
    return None


def build_gateway(settings: GatewaySettings) -> Gateway:
    """The Gateway core from settings: model files, template, tokenizer, engine client."""
    files = load_model_files(settings.tokenizer, settings.chat_template)
    template = ChatTemplate(
        files.chat_template, bos_token=files.bos_token, eos_token=files.eos_token
    )
    tokenizer = load_tokenizer(files.tokenizer_path)
    incremental = IncrementalTokenizer(template, tokenizer, eot_token=files.end_of_turn)
    window = (
        settings.context_window
        or engine_context_window(settings.engine_urls[0], settings.model)
        or files.context_window
        or 32768
    )
    public = settings.public_url or f"http://{settings.host}:{settings.port}"
    options = GatewayOptions(
        model_name=settings.model,
        public_url=public,
        data_dir=settings.data_dir,
        context_window=window,
        fsync=settings.fsync,
        fsync_interval_ms=settings.fsync_interval_ms,
        session_janitor_interval_s=settings.session_janitor_interval_s,
    )
    engine = EngineClient(
        settings.engine_urls,
        settings.model,
        request_timeout_s=settings.request_timeout_s,
        connect_retries=3,
    )
    return Gateway(options, template, incremental, get_parser(settings.parser), engine)


def build_app(settings: GatewaySettings) -> Starlette:
    check_admin_policy(settings)
    gateway = build_gateway(settings)
    return GatewayApp(gateway, settings.admin_token, settings.max_body_bytes).build()


def serve(settings: GatewaySettings, processes: int = 1) -> None:
    """Serve in this process, or supervise N child processes on consecutive ports."""
    if processes <= 1:
        app = build_app(settings)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
        return
    check_admin_policy(settings)
    children: list[subprocess.Popen[bytes]] = []
    for index in range(processes):
        port = settings.port + index
        child_settings = settings.model_copy(
            update={"port": port, "public_url": None, "admin_token": settings.admin_token}
        )
        env = dict(os.environ, ROLLOUT_GATEWAY_SETTINGS=child_settings.model_dump_json())
        children.append(subprocess.Popen([sys.executable, "-m", "workers.gateway_server"], env=env))
        print(f"gateway process {index} on http://{settings.host}:{port}", flush=True)

    def stop(*_: object) -> None:
        for child in children:
            child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [child.wait() for child in children]
    raise SystemExit(max(codes))


if __name__ == "__main__":
    serve(GatewaySettings.model_validate_json(os.environ["ROLLOUT_GATEWAY_SETTINGS"]))
