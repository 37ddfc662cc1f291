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
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
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


def test_without_dest_fetch_fills_the_directory_the_tests_read(
    tmp_path: Path, serve: list[BackgroundServer]
) -> None:
    hub = _url(serve, build_hub(tmp_path / "hub"))
    mirror = _url(serve, _empty(tmp_path))
    folder = tmp_path / "chosen"
    env = {"ROLLOUT_TEMPLATES_DIR": str(folder)}
    runner = CliRunner()
    before = runner.invoke(app, ["templates", "check"], env=env)
    assert before.exit_code == 1 and f"{folder}: no real chat templates" in before.output
    fetched = runner.invoke(
        app, ["templates", "fetch", "--hub-url", hub, "--mirror-url", mirror], env=env
    )
    assert fetched.exit_code == 0, fetched.output
    after = runner.invoke(app, ["templates", "check"], env=env)
    assert after.exit_code == 0 and str(folder) in after.output

    (folder / "qwen3.jinja").unlink()
    (folder / "llama3.1.jinja").write_text("{{ messages }}")
    edited = runner.invoke(app, ["templates", "check"], env=env)
    assert edited.exit_code == 1 and "llama3.1.jinja: sha256 differs" in edited.output
    assert "qwen3.jinja: missing" in edited.output


def test_hf_token_opens_gated_repositories_on_the_hub_only(
    tmp_path: Path, serve: list[BackgroundServer]
) -> None:
    seen: list[tuple[str, str | None]] = []
    files = StaticFiles(directory=build_hub(tmp_path / "hub"))

    async def gated(scope: Scope, receive: Receive, send: Send) -> None:
        auth = Headers(scope=scope).get("authorization")
        seen.append((scope["path"], auth))
        if scope["path"].startswith("/meta-llama/") and auth != "Bearer hf-secret":
            await PlainTextResponse("gated", status_code=401)(scope, receive, send)
            return
        await files(scope, receive, send)

    hub_server = BackgroundServer(gated).start()
    serve.append(hub_server)
    mirror = _url(serve, _empty(tmp_path))
    runner = CliRunner()
    args = ["templates", "fetch", "--hub-url", hub_server.url, "--mirror-url", mirror]
    denied = runner.invoke(app, [*args, "--dest", str(tmp_path / "a")], env={"HF_TOKEN": None})
    assert denied.exit_code == 1 and "HTTP 401" in denied.output
    assert "llama3.1.jinja" in denied.output and "qwen3.jinja" not in denied.output

    opened = runner.invoke(
        app, [*args, "--dest", str(tmp_path / "b")], env={"HF_TOKEN": "hf-secret"}
    )
    assert opened.exit_code == 0, opened.output
    assert (tmp_path / "b" / "llama3.1.jinja").is_file()
    assert (
        "/meta-llama/Llama-3.1-8B-Instruct/resolve/main/tokenizer_config.json",
        "Bearer hf-secret",
    ) in seen
