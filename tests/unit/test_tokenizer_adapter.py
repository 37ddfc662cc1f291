"""The planner's tokenizer: the ids of `tokenizers`' own `encode`, from its offset-free
encoder, for the tiny model's tokenizer and every model family's."""

from __future__ import annotations

from pathlib import Path

import pytest
import tokenizers

from devstack.tiny_families import ensure_family_model, family_names
from devstack.tiny_model import ensure_tiny_model
from gateway.prompt.incremental import load_tokenizer
from tests.fixtures.real_templates import real_templates_dir

TEXTS = [
    "",
    " ",
    "hello world",
    "  leading and trailing  \n\n\t",
    "<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>",
    '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls -la"}}\n</tool_call><|im_end|>',
    "unicode: é ü ß 中文 日本語 emoji 😀🚀 combining e\u0301",
    "numbers 1234567890 3.14159 -42 1e10",
    "code:\n    def f(x):\n        return x ** 2  # comment\n",
    "<|im_end|><|im_end|><|endoftext|>",
    "total 8\n-rw-r--r-- 1 root root 42 hello.py\n" * 200,
]


def _model_dirs() -> list[Path]:
    real_templates_dir()  # the family models need the real templates: fail saying how
    return [ensure_tiny_model(), *(ensure_family_model(name) for name in family_names())]


@pytest.fixture(scope="module")
def model_dirs() -> list[Path]:
    return _model_dirs()


def test_ids_are_those_of_encode_for_every_tokenizer(model_dirs: list[Path]) -> None:
    for model in model_dirs:
        path = model / "tokenizer.json"
        reference = tokenizers.Tokenizer.from_file(str(path))
        adapter = load_tokenizer(path)
        for text in TEXTS:
            expected = reference.encode(text, add_special_tokens=False).ids
            assert adapter.encode(text) == expected, (model.name, text[:40])
        assert adapter.decode(adapter.encode(TEXTS[4])) == TEXTS[4]
