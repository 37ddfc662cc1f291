"""`rollout templates fetch` against a hub and a mirror served on loopback.

The test hub is a directory shaped like the real one (``{repo}/resolve/{revision}/{file}``,
the template in ``tokenizer_config.json``'s field where the manifest says so) built from
the local templates, served over real HTTP by a starlette static app; no other host is
contacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from typer.testing import CliRunner

from devstack.background_server import BackgroundServer
from devstack.real_templates import TemplateSource, sha256_hex, template_sources
from tests.fixtures.real_templates import real_template_text
from workers.cli import app


def _hub_body(source: TemplateSource, text: str) -> bytes:
    if source.newlines == "lf":  # the hub copy has CRLF line ends
        text = text.replace("\n", "\r\n")
    if source.json_field is None:
        return text.encode()
    config = {"bos_token": "<s>", source.json_field: text, "model_max_length": 4096}
    return json.dumps(config, ensure_ascii=False, indent=2).encode()


def build_hub(root: Path, edit: dict[str, str] | None = None) -> Path:
    """A hub tree for every manifest template; `edit`: name → text served instead."""
    for name, source in template_sources().items():
        text = (edit or {}).get(name, real_template_text(name))
        path = root / source.hub_repo / "resolve" / source.revision / source.hub_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_hub_body(source, text))
    return root


def build_mirror(root: Path, names: list[str]) -> Path:
    for name in names:
        m = template_sources()[name].mirror
        assert m is not None
        path = root / m.repo / m.commit / m.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(real_template_text(name))
    return root


@pytest.fixture
def serve() -> Iterator[list[BackgroundServer]]:
    servers: list[BackgroundServer] = []
    yield servers
    for s in servers:
        s.stop()


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _url(servers: list[BackgroundServer], folder: Path) -> str:
    """Serve `folder` over HTTP on loopback (404 for what it lacks)."""
    app_ = Starlette(routes=[Mount("/", StaticFiles(directory=folder))])
    server = BackgroundServer(app_).start()
    servers.append(server)
    return server.url


def _fetch(dest: Path, hub: str, mirror: str, env: dict[str, str] | None = None) -> object:
    args = ["templates", "fetch", "--dest", str(dest), "--mirror-url", mirror]
    if env is None:
        args += ["--hub-url", hub]
    return CliRunner().invoke(app, args, env=env)


def test_fetch_writes_every_template_verified_and_a_rerun_keeps_them(
    tmp_path: Path, serve: list[BackgroundServer]
) -> None:
    hub = _url(serve, build_hub(tmp_path / "hub"))
    mirror = _url(serve, _empty(tmp_path))  # 404s: the hub must suffice
    dest = tmp_path / "templates"
    result = _fetch(dest, hub, mirror)
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    for name, source in template_sources().items():
        assert sha256_hex((dest / f"{name}.jinja").read_bytes()) == source.sha256, name
    assert result.output.count("hub ") == len(template_sources())  # type: ignore[attr-defined]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        f"{n}.jinja" for n in template_sources()
    )

    again = _fetch(dest, hub, mirror)
    assert again.exit_code == 0  # type: ignore[attr-defined]
    assert again.output.count("present ") == len(template_sources())  # type: ignore[attr-defined]


def test_hub_url_comes_from_hf_endpoint(tmp_path: Path, serve: list[BackgroundServer]) -> None:
    hub = _url(serve, build_hub(tmp_path / "hub"))
    mirror = _url(serve, _empty(tmp_path))
    result = _fetch(tmp_path / "out", hub, mirror, env={"HF_ENDPOINT": hub})
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]


def test_a_hub_copy_that_moved_on_falls_back_to_the_mirror(
    tmp_path: Path, serve: list[BackgroundServer]
) -> None:
    moved = {"qwen3": real_template_text("qwen3") + "{# a later revision #}"}
    hub = _url(serve, build_hub(tmp_path / "hub", edit=moved))
    mirror = _url(serve, build_mirror(tmp_path / "mirror", ["qwen3"]))
    dest = tmp_path / "templates"
    result = _fetch(dest, hub, mirror)
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert f"mirror   {dest / 'qwen3.jinja'}" in result.output  # type: ignore[attr-defined]
    assert (dest / "qwen3.jinja").read_text() == real_template_text("qwen3")


def test_no_source_with_the_pinned_bytes_fails_naming_it_and_writes_nothing(
    tmp_path: Path, serve: list[BackgroundServer]
) -> None:
    moved = {"gpt-oss": "{{ messages }}"}
    hub = _url(serve, build_hub(tmp_path / "hub", edit=moved))
    mirror = _url(serve, _empty(tmp_path))
    dest = tmp_path / "templates"
    result = _fetch(dest, hub, mirror)
    assert result.exit_code == 1
    out = result.output  # type: ignore[attr-defined]
    assert "gpt-oss.jinja" in out and template_sources()["gpt-oss"].sha256 in out
    assert sha256_hex(b"{{ messages }}") in out and "HTTP 404" in out
    assert not (dest / "gpt-oss.jinja").exists()
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # no temp file left
    assert (dest / "qwen3.jinja").is_file()  # the others were still fetched
