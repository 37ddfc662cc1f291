"""Tiny models of the published families: one token per structural marker, the real
template rendered by the Gateway's renderer, the family's end-of-turn ids.

Builds land in the shared cache (`ensure_family_model`), so a second run reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from devstack.real_templates import template_names
from devstack.tiny_families import (
    UnknownFamily,
    build_family_model,
    ensure_family_model,
    family_fingerprint,
    family_names,
    get_family,
)
from devstack.tiny_model import source_fingerprint
from gateway.canonical import Message, Tool, ToolCall
from gateway.parsers.selection import parser_for_model
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.model_files import load_model_files
from tests.fixtures.real_templates import real_template_text, real_templates_dir
from workers.cli import app

FAMILIES = family_names()

MARKER_SHAPES = re.compile(
    r"<\|[A-Za-z_]+\|>"  # <|im_start|>, <|channel|>, <|eot_id|>
    r"|<｜[^｜<>]+｜>"  # DeepSeek's full-width markers
    r"|\[/?[A-Za-z_]+\]"  # [INST], [TOOL_CALLS], [gMASK]
    r"|\]~!?b[\[\]]|\[e~\["  # MiniMax's ]~!b[ ]~b] [e~[
)
"""Strings shaped like control tokens: in a rendered prompt each must be one of ours."""

CALL_ID = "call00001"  # 9 alphanumerics: the Mistral templates reject other lengths
TOOL = Tool(
    name="lookup_station",
    description="Find a weather station by city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
RESULT = "station 4471 near the harbour"


def _conversation() -> list[Message]:
    call = ToolCall(id=CALL_ID, name=TOOL.name, arguments=json.dumps({"city": "Lyon"}))
    return [
        Message(role="system", content="You answer with station numbers."),
        Message(role="user", content="Which station serves Lyon?"),
        Message(role="assistant", content=None, tool_calls=[call]),
        Message(role="tool", content=RESULT, tool_call_id=CALL_ID),
    ]


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    real_templates_dir()  # fail at once, saying how to get them, when they are missing
    return {name: ensure_family_model(name) for name in FAMILIES}


def _tokenizer(model: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model / "tokenizer.json"))


def test_the_catalog_has_exactly_the_shipped_templates() -> None:
    assert template_names() == FAMILIES


def test_an_unknown_family_is_refused_with_the_known_names(tmp_path: Path) -> None:
    with pytest.raises(UnknownFamily) as caught:
        ensure_family_model("qwen9", tmp_path)
    assert all(name in str(caught.value) for name in FAMILIES)
    assert not any(tmp_path.iterdir())


def test_the_cli_stops_on_an_unknown_family_listing_the_names(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["make-tiny-model", str(tmp_path / "m"), "--family", "x"])
    assert result.exit_code == 2
    assert "glm-4.7-flash" in result.output and "mistral-nemo" in result.output
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_the_cli_says_how_to_get_missing_templates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_TEMPLATES_DIR", str(tmp_path / "none"))
    args = ["make-tiny-model", str(tmp_path / "m"), "--family", "gpt-oss"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "ROLLOUT_TEMPLATES_DIR" in result.output and "templates fetch" in result.output


def test_a_family_build_is_byte_identical_every_time(
    built: dict[str, Path], tmp_path: Path
) -> None:
    info = build_family_model(tmp_path / "again", "gpt-oss")
    for name, digest in info.files.items():
        assert digest.path.read_bytes() == (built["gpt-oss"] / name).read_bytes(), name


@pytest.mark.parametrize("name", FAMILIES)
def test_every_structural_marker_is_one_token(built: dict[str, Path], name: str) -> None:
    family, tokenizer = get_family(name), _tokenizer(built[name])
    for marker in family.structural:
        ids = tokenizer.encode(marker, add_special_tokens=False).ids
        assert len(ids) == 1, (marker, ids)
        assert tokenizer.decode(ids, skip_special_tokens=False) == marker
        wrapped = tokenizer.encode(f"a{marker}b", add_special_tokens=False).ids
        assert ids[0] in wrapped, marker  # also one token between ordinary text


@pytest.mark.parametrize("name", FAMILIES)
def test_control_tokens_are_special_and_markup_stays_visible(
    built: dict[str, Path], name: str
) -> None:
    family = get_family(name)
    added = json.loads((built[name] / "tokenizer.json").read_text())["added_tokens"]
    special = {t["content"]: t["special"] for t in added}
    assert special == {**dict.fromkeys(family.control, True), **dict.fromkeys(family.markup, False)}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_model_dir_carries_the_real_template_and_the_end_ids(
    built: dict[str, Path], name: str
) -> None:
    family, model = get_family(name), built[name]
    tokenizer = _tokenizer(model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    assert config["chat_template"] == real_template_text(name)
    assert (config["bos_token"], config["eos_token"]) == (family.bos, family.eos)
    ends = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    ends = ends if isinstance(ends, list) else [ends]
    assert [tokenizer.id_to_token(i) for i in ends] == list(family.end_of_turn)
    files = load_model_files(model)
    assert files.end_of_turn == list(dict.fromkeys([family.eos, *family.end_of_turn]))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    assert tokenizer.get_vocab_size(with_added_tokens=True) == vocab  # every id decodes


@pytest.mark.parametrize("name", FAMILIES)
def test_the_gateway_renders_a_tool_conversation_in_the_family_tokens(
    built: dict[str, Path], name: str
) -> None:
    family, model = get_family(name), built[name]
    files = load_model_files(model)
    template = ChatTemplate(
        files.chat_template, bos_token=files.bos_token, eos_token=files.eos_token
    )
    assert template.supports_tools
    text = template.render(_conversation(), tools=[TOOL], add_generation_prompt=True)
    assert RESULT in text and "Lyon" in text
    shaped = set(MARKER_SHAPES.findall(text))
    assert shaped, "the rendered prompt shows none of the family's markers"
    assert shaped <= set(family.structural), shaped - set(family.structural)
    tokenizer = _tokenizer(model)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    marker_ids = {tokenizer.token_to_id(m): m for m in family.structural}
    for marker_id, marker in marker_ids.items():
        assert ids.count(marker_id) == text.count(marker), marker


@pytest.mark.parametrize("name", FAMILIES)
def test_the_gateway_picks_the_family_parser_whose_end_markers_are_tokens(
    built: dict[str, Path], name: str
) -> None:
    """The Gateway finds the end of a reply by token: every end marker of the parser it
    picks for the model dir must be one id of the family's tokenizer."""
    files = load_model_files(built[name])
    parser = parser_for_model(files.chat_template, files.end_of_turn)
    assert parser.name == name
    tokenizer = _tokenizer(built[name])
    for marker in parser.end_markers:
        assert len(tokenizer.encode(marker, add_special_tokens=False).ids) == 1, marker


def test_each_family_has_its_own_cache_key_beside_the_default_build(tmp_path: Path) -> None:
    keys = {family_fingerprint(name) for name in FAMILIES}
    assert len(keys) == len(FAMILIES)
    assert source_fingerprint() not in keys
    first = ensure_family_model("mistral-nemo", tmp_path)
    assert first.name == f"tiny-mistral-nemo-{family_fingerprint('mistral-nemo')}"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_family_model("mistral-nemo", tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
