"""Loading a new policy checkpoint into a running engine: the interface and vLLM's.

Why here: the trainer uses it today (it loads each new policy into the engines itself)
and the Gateway's policy-update endpoint will use it later (pause, drain, load, resume);
`schemas` is the one package both may import.

What vLLM 0.32 offers (read from its source): with `VLLM_SERVER_DEV_MODE=1` the server
mounts `/pause` (`mode=wait` lets in-flight requests finish, `keep` freezes them, `abort`
drops them; new requests queue until `/resume`), `/collective_rpc` (runs a worker
method; the worker's `reload_weights(weights_path=DIR)` reloads every parameter in
place from a checkpoint directory), `/reset_prefix_cache`, `/update_weight_version` and
`/weight_info`. Sleep/wake are no-ops on the CPU worker (it logs "not supported"), and
the NCCL/IPC weight-transfer engines need a GPU, so in-place reload from disk is the
path here; restarting the engine is the fallback (`devstack.vllm_server`).
"""

import time
from pathlib import Path
from typing import Literal, Protocol

import httpx
from pydantic import Field

from schemas.base import StrictModel

PauseMode = Literal["wait", "keep", "abort"]


class WeightUpdate(StrictModel):
    policy_version: str = Field(min_length=1, max_length=256)
    checkpoint: str = Field(min_length=1, description="model directory the engine can read")


class WeightUpdateReport(StrictModel):
    engine: str
    policy_version: str
    method: Literal["reload", "restart"]
    pause_s: float
    load_s: float
    total_s: float


class WeightLoadError(RuntimeError):
    """The engine did not load the checkpoint (it keeps serving its previous weights)."""


class WeightLoader(Protocol):
    """One engine that can switch its weights to a new checkpoint."""

    async def current_version(self) -> str | None: ...

    async def load(self, update: WeightUpdate) -> WeightUpdateReport: ...


def check_checkpoint(path: str) -> None:
    """Refuse an obviously unusable checkpoint before the engine pauses for it."""
    root = Path(path)
    if not (root / "config.json").is_file():
        raise WeightLoadError(f"{path}: no config.json")
    if not any(root.glob("*.safetensors")):
        raise WeightLoadError(f"{path}: no *.safetensors weights")


class VllmWeightLoader:
    """In-place reload through vLLM's dev endpoints (server started with
    `VLLM_SERVER_DEV_MODE=1`); the engine always resumes, also when loading fails."""

    def __init__(
        self, base_url: str, pause_mode: PauseMode = "wait", timeout_s: float = 600.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s

    async def _post(self, client: httpx.AsyncClient, path: str, **kwargs: object) -> httpx.Response:
        reply = await client.post(f"{self.base_url}{path}", **kwargs)  # type: ignore[arg-type]
        if reply.status_code == 404:
            raise WeightLoadError(
                f"{self.base_url}{path}: 404 — start vLLM with VLLM_SERVER_DEV_MODE=1"
            )
        if reply.status_code >= 400:
            raise WeightLoadError(f"{self.base_url}{path}: {reply.status_code} {reply.text[:500]}")
        return reply

    async def current_version(self) -> str | None:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            reply = await client.get(f"{self.base_url}/weight_info")
            if reply.status_code != 200:
                return None
            return reply.json().get("weight_version")

    async def load(self, update: WeightUpdate) -> WeightUpdateReport:
        check_checkpoint(update.checkpoint)
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            await self._post(client, "/pause", params={"mode": self.pause_mode})
            paused = time.monotonic()
            try:
                await self._post(
                    client,
                    "/collective_rpc",
                    json={
                        "method": "reload_weights",
                        "kwargs": {"weights_path": str(update.checkpoint)},
                    },
                )
                await self._post(client, "/reset_prefix_cache")
                await self._post(
                    client, "/update_weight_version", json={"new_version": update.policy_version}
                )
            finally:
                loaded = time.monotonic()
                await self._post(client, "/resume")
        return WeightUpdateReport(
            engine=self.base_url,
            policy_version=update.policy_version,
            method="reload",
            pause_s=round(paused - started, 4),
            load_s=round(loaded - paused, 4),
            total_s=round(time.monotonic() - started, 4),
        )
