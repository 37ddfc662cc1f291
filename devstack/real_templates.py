"""Real chat templates of published model families: where they come from, where they are
read from, and the check that they are the bytes we tested against.

Why not in the repo: they are third-party files (each model's own license), so the
project keeps only their provenance (``chat_template_sources.json``) and reads them
from a directory of ``<name>.jinja`` files, found in this order:

1. ``$ROLLOUT_TEMPLATES_DIR`` when set;
2. ``../shared/chat_templates`` beside the repository, when that directory exists;
3. ``$ROLLOUT_CACHE_DIR/chat_templates`` (default ``~/.cache/agentic-rollout``), where
   ``rollout templates fetch`` writes them (into ``$ROLLOUT_TEMPLATES_DIR`` when set).

Each source names the model repository on the Hugging Face hub, the file holding the
template (``chat_template.jinja``, or ``tokenizer_config.json`` whose ``chat_template``
field holds it) and the revision; ``mirror`` is a published copy at a fixed commit,
checked byte for byte. The sha256 is the pin: a hub revision that moved on shows up as
a checksum mismatch, never as a silently different template.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from environments.cache import default_cache_dir

TEMPLATES_DIR_ENV = "ROLLOUT_TEMPLATES_DIR"
FETCH_COMMAND = "rollout templates fetch"


class Mirror(BaseModel):
    """A copy of the template in a git repository, at a commit (fetched raw)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    path: str


class TemplateSource(BaseModel):
    """One real template: its upstream file and the sha256 of the ``<name>.jinja`` we use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[\w.-]+$")
    hub_repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    hub_file: str
    json_field: str | None = None
    """Set when `hub_file` is JSON (``tokenizer_config.json``): the key holding the text."""
    revision: str = "main"
    newlines: Literal["keep", "lf"] = "keep"
    """``lf``: the hub copy has CRLF line ends that the tested copy does not."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    mirror: Mirror | None = None

    @property
    def filename(self) -> str:
        return f"{self.name}.jinja"


class SourcesFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    templates: tuple[TemplateSource, ...]


class TemplatesUnavailable(RuntimeError):
    """The templates directory lacks some templates: says how to get them."""


class TemplateChecksumError(RuntimeError):
    """A template's bytes are not the ones the manifest pins."""


@cache
def template_sources() -> dict[str, TemplateSource]:
    """The manifest, by template name."""
    raw = resources.files("devstack").joinpath("chat_template_sources.json").read_text()
    return {s.name: s for s in SourcesFile.model_validate_json(raw).templates}


def template_names() -> list[str]:
    return sorted(template_sources())


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def cache_templates_dir() -> Path:
    return default_cache_dir() / "chat_templates"


def default_fetch_dir() -> Path:
    """Where ``rollout templates fetch`` writes when no ``--dest`` is given: the variable's
    directory when it is set (so the tests then read what was fetched), else the cache."""
    env = os.environ.get(TEMPLATES_DIR_ENV)
    return Path(env).expanduser() if env else cache_templates_dir()


def templates_dir() -> Path:
    """The directory real templates are read from (see the module docstring for the order)."""
    env = os.environ.get(TEMPLATES_DIR_ENV)
    if env:
        return Path(env).expanduser()
    beside = repo_root().parent / "shared" / "chat_templates"
    if beside.is_dir():
        return beside
    return cache_templates_dir()


def how_to_get_them() -> str:
    return (
        f"run `.venv/bin/{FETCH_COMMAND}` (needs the model hub; writes "
        f"{default_fetch_dir()}, --dest DIR elsewhere, --hub-url URL or HF_ENDPOINT for "
        f"another hub) or set {TEMPLATES_DIR_ENV} to a directory of <name>.jinja files"
    )


def missing_templates(folder: Path | None = None) -> list[str]:
    folder = templates_dir() if folder is None else folder
    return [n for n in template_names() if not (folder / f"{n}.jinja").is_file()]


def require_templates(folder: Path | None = None) -> Path:
    """The templates directory, once every manifest template is in it."""
    folder = templates_dir() if folder is None else folder
    missing = missing_templates(folder)
    if len(missing) == len(template_sources()):
        raise TemplatesUnavailable(f"no real chat templates in {folder}: {how_to_get_them()}")
    if missing:
        raise TemplatesUnavailable(
            f"real chat templates missing in {folder}: {', '.join(missing)}; {how_to_get_them()}"
        )
    return folder


def template_problems(folder: Path | None = None) -> list[str]:
    """What keeps the tests from reading `folder`'s templates: one line per missing file
    or checksum mismatch (empty when all is well)."""
    folder = templates_dir() if folder is None else folder
    if len(missing_templates(folder)) == len(template_sources()):
        return [f"{folder}: no real chat templates"]
    problems: list[str] = []
    for source in template_sources().values():
        path = folder / source.filename
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        try:
            verify(source, path.read_bytes(), str(path))
        except TemplateChecksumError:
            problems.append(f"{path}: sha256 differs from the manifest's {source.sha256}")
    return problems


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify(source: TemplateSource, data: bytes, where: str) -> None:
    found = sha256_hex(data)
    if found != source.sha256:
        raise TemplateChecksumError(
            f"{where}: sha256 {found}, but the manifest pins {source.sha256} for "
            f"{source.filename} ({source.hub_repo} {source.hub_file}); {how_to_get_them()}"
        )


def read_template(name: str, folder: Path | None = None) -> str:
    """A real template's text, after checking its bytes against the manifest."""
    source = template_sources()[name]
    path = require_templates(folder) / source.filename
    data = path.read_bytes()
    verify(source, data, str(path))
    return data.decode()
