"""Fetch the real chat templates from the model hub into a directory, checked by sha256.

For each manifest entry (``devstack.real_templates``): GET
``{hub}/{repo}/resolve/{revision}/{file}`` (``$HF_TOKEN`` as bearer when set: gated
repositories), take the ``chat_template`` field when the file is ``tokenizer_config.json``,
and keep the text only if its sha256 is the pinned one. A hub copy that differs (the
repository's template moved on since) falls back to the entry's mirror,
``{mirror}/{repo}/{commit}/{path}`` (raw files of a git host). Files are written
atomically (temp file, then rename); a file already there with the right checksum is not
fetched again, so a rerun only completes what is missing.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

from devstack.real_templates import (
    TemplateChecksumError,
    TemplateSource,
    sha256_hex,
    template_sources,
    verify,
)

DEFAULT_HUB_URL = "https://huggingface.co"
DEFAULT_MIRROR_URL = "https://raw.githubusercontent.com"
HUB_URL_ENV = "HF_ENDPOINT"
HUB_TOKEN_ENV = "HF_TOKEN"
"""Sent to the hub only (gated repositories such as meta-llama's answer 401 without it)."""


class FetchError(RuntimeError):
    """No source gave the pinned bytes of a template."""


class FetchResult(BaseModel):
    name: str
    origin: str
    """``present`` (already there, checksum right), ``hub`` or ``mirror``."""
    path: str


def hub_url_default() -> str:
    return os.environ.get(HUB_URL_ENV) or DEFAULT_HUB_URL


def hub_file_url(hub_url: str, source: TemplateSource) -> str:
    return f"{hub_url.rstrip('/')}/{source.hub_repo}/resolve/{source.revision}/{source.hub_file}"


def mirror_file_url(mirror_url: str, source: TemplateSource) -> str | None:
    m = source.mirror
    if m is None:
        return None
    return f"{mirror_url.rstrip('/')}/{m.repo}/{m.commit}/{m.path}"


def template_bytes(source: TemplateSource, body: bytes) -> bytes:
    """The template text out of a downloaded file, as the tested copy has it."""
    if source.json_field is None:
        text = body.decode()
    else:
        value = json.loads(body)[source.json_field]
        if isinstance(value, list):  # named variants: transformers uses "default"
            value = {v["name"]: v["template"] for v in value}["default"]
        text = str(value)
    if source.newlines == "lf":
        text = text.replace("\r\n", "\n")
    return text.encode()


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _try(
    client: httpx.Client,
    source: TemplateSource,
    url: str,
    extract: bool,
    headers: dict[str, str],
) -> bytes | str:
    """The verified bytes, or why this URL did not give them."""
    try:
        r = client.get(url, headers=headers)
    except httpx.HTTPError as e:
        return f"{url}: {type(e).__name__}: {e}"
    if r.status_code != 200:
        return f"{url}: HTTP {r.status_code}"
    try:
        data = template_bytes(source, r.content) if extract else r.content
        verify(source, data, url)
    except (TemplateChecksumError, ValueError, KeyError) as e:
        return f"{type(e).__name__}: {e}"
    return data


def fetch_one(
    client: httpx.Client, source: TemplateSource, dest: Path, hub_url: str, mirror_url: str
) -> FetchResult:
    path = dest / source.filename
    if path.is_file() and sha256_hex(path.read_bytes()) == source.sha256:
        return FetchResult(name=source.name, origin="present", path=str(path))
    tried: list[str] = []
    token = os.environ.get(HUB_TOKEN_ENV)
    hub_headers = {"Authorization": f"Bearer {token}"} if token else {}
    candidates = [("hub", hub_file_url(hub_url, source), True, hub_headers)]
    mirror = mirror_file_url(mirror_url, source)
    if mirror is not None:
        candidates.append(("mirror", mirror, False, {}))
    for origin, url, extract, headers in candidates:
        got = _try(client, source, url, extract, headers)
        if isinstance(got, bytes):
            write_atomic(path, got)
            return FetchResult(name=source.name, origin=origin, path=str(path))
        tried.append(got)
    raise FetchError(
        f"{source.filename}: no source gave sha256 {source.sha256}: {'; '.join(tried)}"
    )


def fetch_templates(
    dest: Path,
    hub_url: str | None = None,
    mirror_url: str = DEFAULT_MIRROR_URL,
    timeout_s: float = 30.0,
) -> list[FetchResult]:
    """Every manifest template into `dest`; raises `FetchError` naming each one that failed
    (after trying them all, so one run reports every problem)."""
    hub = hub_url or hub_url_default()
    results: list[FetchResult] = []
    errors: list[str] = []
    with httpx.Client(timeout=timeout_s, follow_redirects=True) as client:
        for source in template_sources().values():
            try:
                results.append(fetch_one(client, source, dest, hub, mirror_url))
            except FetchError as e:
                errors.append(str(e))
    if errors:
        raise FetchError("\n".join(errors))
    return results
