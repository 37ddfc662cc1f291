"""The real templates' manifest, where they are looked up, and the checksum on read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from devstack import real_templates
from devstack.real_templates import (
    TEMPLATES_DIR_ENV,
    TemplateChecksumError,
    TemplatesUnavailable,
    read_template,
    require_templates,
    sha256_hex,
    template_names,
    template_sources,
    templates_dir,
)
from tests.fixtures.real_templates import real_templates_dir


def test_every_manifest_entry_matches_the_file_the_tests_read() -> None:
    folder = real_templates_dir()
    on_disk = sorted(p.stem for p in folder.glob("*.jinja"))
    assert template_names() == on_disk
    for name, source in template_sources().items():
        assert sha256_hex((folder / source.filename).read_bytes()) == source.sha256, name
        assert (source.json_field is None) == (not source.hub_file.endswith(".json")), name


def _copy_templates(to: Path) -> Path:
    to.mkdir(parents=True)
    for name in template_names():
        shutil.copy(real_templates_dir() / f"{name}.jinja", to / f"{name}.jinja")
    return to


def test_the_variable_names_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _copy_templates(tmp_path / "mine")
    monkeypatch.setenv(TEMPLATES_DIR_ENV, str(folder))
    assert templates_dir() == folder
    assert read_template("qwen3") == (folder / "qwen3.jinja").read_text()


def test_without_the_variable_shared_beside_the_repo_then_the_fetch_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TEMPLATES_DIR_ENV, raising=False)
    monkeypatch.setenv("ROLLOUT_CACHE_DIR", str(tmp_path / "cache"))
    repo = tmp_path / "work" / "repo"
    repo.mkdir(parents=True)
    monkeypatch.setattr(real_templates, "repo_root", lambda: repo)
    assert templates_dir() == tmp_path / "cache" / "chat_templates"
    beside = tmp_path / "work" / "shared" / "chat_templates"
    beside.mkdir(parents=True)
    assert templates_dir() == beside


def test_missing_templates_say_how_to_get_them(tmp_path: Path) -> None:
    folder = tmp_path / "partial"
    _copy_templates(folder)
    (folder / "gpt-oss.jinja").unlink()
    with pytest.raises(TemplatesUnavailable) as err:
        require_templates(folder)
    message = str(err.value)
    assert "gpt-oss" in message and str(folder) in message
    assert "rollout templates fetch" in message and TEMPLATES_DIR_ENV in message


def test_a_changed_template_is_refused_naming_file_and_both_checksums(tmp_path: Path) -> None:
    folder = _copy_templates(tmp_path / "edited")
    path = folder / "qwen2.5.jinja"
    path.write_text(path.read_text() + " ")
    with pytest.raises(TemplateChecksumError) as err:
        read_template("qwen2.5", folder)
    message = str(err.value)
    assert str(path) in message
    assert template_sources()["qwen2.5"].sha256 in message
    assert sha256_hex(path.read_bytes()) in message
