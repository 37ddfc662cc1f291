"""`upload_artifacts`: copy the rollout's artifacts dir to S3 or a local directory.

Why: sandboxes and worker hosts are ephemeral, and Temporal must only carry
references — so logs, diffs and metrics go to durable storage and the result keeps
their URIs. `dest` is ``s3://bucket/prefix`` (boto3; `endpoint_url` for S3-compatible
stores such as MinIO or moto) or a local path / ``file://`` URL. Objects land under
``<dest>/<rollout_id>/<relative path>``. Put it last in the hook list.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from hooks.base import Hook, HookContext, register_hook
from schemas.base import StrictModel
from schemas.outcome import ArtifactRef


class UploadArtifactsParams(StrictModel):
    dest: str
    endpoint_url: str | None = None
    region: str | None = None
    #: Also upload what exists when the rollout failed.
    on_error: bool = True


def _upload_sync(params: UploadArtifactsParams, rollout_id: str, refs: list[ArtifactRef]) -> None:
    parsed = urlsplit(params.dest)
    if parsed.scheme == "s3":
        import boto3

        client = boto3.client("s3", endpoint_url=params.endpoint_url, region_name=params.region)
        prefix = parsed.path.strip("/")
        for ref in refs:
            if not ref.local_path or not Path(ref.local_path).is_file():
                continue
            key = "/".join(p for p in (prefix, rollout_id, ref.name) if p)
            client.upload_file(ref.local_path, parsed.netloc, key)
            ref.uri = f"s3://{parsed.netloc}/{key}"
        return
    if parsed.scheme not in ("", "file"):
        raise ValueError(f"unsupported artifact destination {params.dest!r} (s3:// or a path)")
    root = Path(parsed.path if parsed.scheme == "file" else params.dest) / rollout_id
    for ref in refs:
        if not ref.local_path or not Path(ref.local_path).is_file():
            continue
        target = root / ref.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(ref.local_path).resolve() != target.resolve():
            shutil.copyfile(ref.local_path, target)
        ref.uri = target.resolve().as_uri()


@register_hook
class UploadArtifactsHook(Hook):
    name = "upload_artifacts"
    Params = UploadArtifactsParams
    params: UploadArtifactsParams

    async def after_run(self, ctx: HookContext) -> None:
        # boto3 is blocking: keep the event loop (and activity heartbeats) free.
        await asyncio.to_thread(_upload_sync, self.params, ctx.rollout_id, ctx.outcome.artifacts)

    async def on_error(self, ctx: HookContext, error: BaseException) -> None:
        if self.params.on_error:
            await self.after_run(ctx)
