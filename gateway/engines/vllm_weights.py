"""Loading a new policy checkpoint into a running vLLM engine, in place.

The Gateway's policy update (`gateway.policy.update`: pause, drain, load, resume) uses it, and so
does the trainer when it runs without a gateway: it imports this module alone, so it
imports nothing heavier than httpx (and `base`, pydantic only).

What vLLM 0.32 offers (read from its source): with `VLLM_SERVER_DEV_MODE=1` the server
mounts `/pause` (`mode=wait` lets in-flight requests finish, `keep` freezes them, `abort`
drops them; new requests queue until `/resume`), `/collective_rpc` (runs a worker
method; the worker's `reload_weights(weights_path=DIR)` reloads every parameter in
place from a checkpoint directory), `/reset_prefix_cache`, `/update_weight_version` and
`/weight_info`. Sleep/wake are no-ops on the CPU worker (it logs "not supported"), and
the NCCL/IPC weight-transfer engines need a GPU, so in-place reload from disk is the
path here; restarting the engine is the fallback (`devstack.vllm_server`).

A reload that fails inside vLLM 0.32 kills its engine core (EngineDeadError: every later
request fails), so a checkpoint is checked against the model the engine serves — tensor
names and shapes, read from the safetensors headers — before the engine is touched.
"""

import json
import math
import os
import struct
import time
from pathlib import Path

import httpx

from gateway.engines.base import WeightLoadError
from schemas.policy import PauseMode, WeightUpdate, WeightUpdateReport

_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
"""Bytes per element of the safetensors dtypes (sub-byte ones are not checked)."""

MAX_HEADER_BYTES = 100 * 2**20


def check_checkpoint(path: str) -> None:
    """Refuse an unusable checkpoint before the engine pauses for it: no config.json (or
    not JSON), no weights, or a weights file whose header does not parse or does not
    account for the file's bytes (a truncated copy)."""
    root = Path(path)
    try:
        json.loads((root / "config.json").read_bytes())
    except FileNotFoundError:
        raise WeightLoadError(f"{path}: no config.json") from None
    except (OSError, ValueError) as exc:
        raise WeightLoadError(f"{path}/config.json is unreadable: {exc}") from exc
    if not any(root.glob("*.safetensors")):
        raise WeightLoadError(f"{path}: no *.safetensors weights")
    tensor_shapes(root)


def _read_header(path: Path) -> dict[str, object]:
    """A safetensors file's header, checked against the file: every tensor's bytes lie in
    the file, match its dtype and shape, and the data ends where the file ends."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise WeightLoadError(f"{path}: {len(head)} bytes, no safetensors header")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER_BYTES:
                raise WeightLoadError(f"{path}: safetensors header of {size} bytes")
            raw = fh.read(size)
            file_size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise WeightLoadError(f"{path}: unreadable: {exc}") from exc
    if len(raw) < size:
        raise WeightLoadError(f"{path}: truncated inside its {size}-byte header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise WeightLoadError(f"{path}: unreadable safetensors header") from exc
    if not isinstance(header, dict):
        raise WeightLoadError(f"{path}: safetensors header is not a JSON object")
    data_size, end_max = file_size - 8 - size, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            shape = [int(n) for n in entry["shape"]]
            dtype = entry["dtype"]
        except (TypeError, KeyError, ValueError) as exc:
            raise WeightLoadError(f"{path}: tensor {name} has no valid entry") from exc
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise WeightLoadError(f"{path}: tensor {name} has bad data_offsets")
        width = _DTYPE_BYTES.get(dtype)
        if width is not None and end - begin != width * math.prod(shape):
            raise WeightLoadError(
                f"{path}: tensor {name} {dtype}{shape} is not {end - begin} bytes"
            )
        end_max = max(end_max, end)
    if end_max != data_size:
        raise WeightLoadError(
            f"{path}: truncated or padded: the header indexes {end_max} data bytes, "
            f"the file holds {data_size}"
        )
    return header


def tensor_shapes(model_dir: str | Path) -> dict[str, list[int]]:
    """Name → shape of every tensor in a directory's `*.safetensors` (headers only, each
    checked against its file's size)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for name, entry in _read_header(path).items():
            if name != "__metadata__":
                shapes[name] = list(entry["shape"])  # type: ignore[index]
    return shapes


def check_compatible(checkpoint: str | Path, served: str | Path) -> None:
    """Refuse a checkpoint the served model cannot take: a tensor of the served model
    missing, or one with another shape. Extra tensors pass (a trainer may store a tied
    head explicitly)."""
    new, old = tensor_shapes(checkpoint), tensor_shapes(served)
    missing = sorted(set(old) - set(new))
    wrong = [
        f"{n} {new[n]} (serves {old[n]})" for n in sorted(old) if n in new and new[n] != old[n]
    ]
    problems = ([f"missing {', '.join(missing[:5])}"] if missing else []) + (
        [f"shape of {', '.join(wrong[:5])}"] if wrong else []
    )
    if problems:
        raise WeightLoadError(
            f"{checkpoint} does not fit the served model {served}: " + "; ".join(problems)
        )


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

    async def served_model_dir(self, client: httpx.AsyncClient) -> Path | None:
        """The directory the engine was started from (`root` in /v1/models), when this
        host can read it; None for a remote engine."""
        reply = await client.get(f"{self.base_url}/v1/models")
        if reply.status_code != 200:
            raise WeightLoadError(f"{self.base_url}/v1/models: {reply.status_code}")
        for card in reply.json().get("data", []):
            root = card.get("root") if isinstance(card, dict) else None
            if isinstance(root, str) and any(Path(root).glob("*.safetensors")):
                return Path(root)
        return None

    async def load(self, update: WeightUpdate) -> WeightUpdateReport:
        """Check, pause, reload, resume. A failure before the reload starts leaves the
        engine on its weights; one from the reload on is `touched`. The engine is resumed
        in every case (also when this is cancelled)."""
        check_checkpoint(update.checkpoint)
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            try:
                served = await self.served_model_dir(client)
            except httpx.HTTPError as exc:
                raise WeightLoadError(f"{self.base_url}: unreachable: {exc!r}") from exc
            if served is not None:
                check_compatible(update.checkpoint, served)
            touched, error = False, None
            try:
                await self._post(client, "/pause", params={"mode": self.pause_mode})
                paused = time.monotonic()
                touched = True
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
            except (WeightLoadError, httpx.HTTPError) as exc:
                error = WeightLoadError(str(exc) or repr(exc), touched=touched)
            finally:
                loaded = time.monotonic()
                try:
                    await self._post(client, "/resume")
                except (WeightLoadError, httpx.HTTPError) as exc:
                    resumed = f"{self.base_url}/resume failed, it may stay paused: {exc!r}"
                    error = WeightLoadError(
                        f"{error}; {resumed}" if error else resumed, touched=True
                    )
            if error is not None:
                raise error
        return WeightUpdateReport(
            engine=self.base_url,
            policy_version=update.policy_version,
            method="reload",
            pause_s=round(paused - started, 4),
            load_s=round(loaded - paused, 4),
            total_s=round(time.monotonic() - started, 4),
        )
