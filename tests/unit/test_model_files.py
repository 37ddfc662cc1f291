"""Reading a model directory: template, special tokens, context window, end-of-turn set."""

import json
import shutil
from pathlib import Path

import pytest

from devstack.tiny_model import ensure_tiny_model
from gateway.prompt.model_files import ModelFilesError, load_model_files


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(ensure_tiny_model(), target)
    return target


def test_tiny_model_files(model_dir: Path) -> None:
    files = load_model_files(model_dir)
    assert files.eos_token == "<|im_end|>"
    assert files.end_of_turn == ["<|im_end|>"]
    assert "<|im_start|>" in files.chat_template
    assert files.context_window and files.context_window >= 4096
    assert files.vocab_size == json.loads((model_dir / "config.json").read_text())["vocab_size"]


def test_generation_config_stop_ids_join_the_end_of_turn_set(model_dir: Path) -> None:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    (model_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]})
    )
    assert load_model_files(model_dir).end_of_turn == ["<|im_end|>", "<|endoftext|>"]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 10**9}))
    with pytest.raises(ModelFilesError, match="not in the tokenizer"):
        load_model_files(model_dir)


def test_missing_pieces_are_named(model_dir: Path) -> None:
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelFilesError, match=r"tokenizer\.json"):
        load_model_files(model_dir)
