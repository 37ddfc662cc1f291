"""Build the tiny test/demo model directory (``rollout make-tiny-model DIR``).

Everything is derived from seeds and project-written sources, so the same code gives
byte-identical files: the trajectory tests and the samples' lineage can rely on token IDs
and template hashes not moving between builds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from importlib import resources
from importlib.metadata import version
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from environments.cache import default_cache_dir

from .corpus import generate_corpus
from .template import chat_template_sha256, chat_template_text
from .tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    ReencodeExample,
    find_reencode_divergence,
    padded_vocab_size,
    train_tokenizer,
)
from .weights import TinyQwen3Shape, hf_config, init_weights, write_weights

SERVED_MODEL_NAME = "tiny-qwen3"


class FileDigest(BaseModel):
    path: Path
    sha256: str
    size: int


class TinyModelInfo(BaseModel):
    """What a build produced; ``files`` maps file name to its digest."""

    out_dir: Path
    files: dict[str, FileDigest]
    tokenizer_size: int
    vocab_size: int
    token_ids: dict[str, int]
    eos_token_id: int
    pad_token_id: int
    chat_template_sha256: str
    reencode_example: ReencodeExample


SOURCE_SUFFIXES = (".py", ".jinja", ".txt")
"""Files whose bytes shape a build: code, the chat template, the word lists."""

WARM_SOURCES = ("logprobs.py", "task_agent.py", "tasks.py", "warm.py", "warmup.py")
"""Files that shape only the warm model (its own hash covers them), not the random one."""


def _source_files(folder: Traversable, prefix: str = "") -> list[tuple[str, bytes]]:
    """(relative name, bytes) of every source file below ``folder``, sorted by name."""
    found: list[tuple[str, bytes]] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = f"{prefix}{entry.name}"
        if entry.is_dir() and entry.name != "__pycache__":
            found += _source_files(entry, f"{name}/")
        elif entry.is_file() and entry.name.endswith(SOURCE_SUFFIXES) and name not in WARM_SOURCES:
            found.append((name, entry.read_bytes()))
    return found


def source_fingerprint() -> str:
    """Hash of the builder sources, its word lists and the library versions that shape it.

    Used as the cache key: a changed word list, template or tokenizers release rebuilds.
    """
    digest = hashlib.sha256()
    for name, data in _source_files(resources.files(__package__)):
        digest.update(name.encode())
        digest.update(data)
    for dist in ("tokenizers", "numpy", "safetensors"):
        digest.update(f"{dist}=={version(dist)}".encode())
    return digest.hexdigest()[:16]


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_tiny_model(out_dir: Path, shape: TinyQwen3Shape | None = None) -> TinyModelInfo:
    """Write corpus, tokenizer, chat template, config and weights into ``out_dir``."""
    shape = shape or TinyQwen3Shape()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    corpus = generate_corpus()
    (out_dir / "corpus.txt").write_text(corpus, encoding="utf-8")
    tokenizer = train_tokenizer(corpus.splitlines())
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)

    token_ids = {t: tokenizer.token_to_id(t) for t in (*SPECIAL_TOKENS, *MARKUP_TOKENS)}
    eos_id, pad_id = token_ids[IM_END], token_ids[ENDOFTEXT]
    tokenizer_size = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab_size = padded_vocab_size(tokenizer)

    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": shape.max_position_embeddings,
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "additional_special_tokens": [IM_START, IM_END],
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "errors": "replace",
            "chat_template": chat_template_text(),
        },
    )
    _write_json(
        out_dir / "special_tokens_map.json",
        {
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "additional_special_tokens": [IM_START, IM_END],
        },
    )
    _write_json(out_dir / "config.json", hf_config(shape, vocab_size, eos_id, pad_id))
    # A single EOS: when structured outputs complete, vLLM lets the model pick any EOS id,
    # and tests want the turn to end with <|im_end|> as the template renders it. No
    # sampling defaults here: vLLM applies them to every request that leaves one unset.
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": pad_id, "eos_token_id": eos_id, "pad_token_id": pad_id},
    )
    write_weights(out_dir / "model.safetensors", init_weights(shape, vocab_size))
    (out_dir / "model.safetensors").chmod(0o644)

    names = (
        "corpus.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "config.json",
        "generation_config.json",
        "model.safetensors",
    )
    files = {
        n: FileDigest(
            path=out_dir / n, sha256=_sha256(out_dir / n), size=(out_dir / n).stat().st_size
        )
        for n in names
    }
    return TinyModelInfo(
        out_dir=out_dir,
        files=files,
        tokenizer_size=tokenizer_size,
        vocab_size=vocab_size,
        token_ids=token_ids,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        chat_template_sha256=chat_template_sha256(),
        reencode_example=find_reencode_divergence(tokenizer),
    )


def ensure_tiny_model(cache_dir: Path | None = None) -> Path:
    """Return a cached build keyed by :func:`source_fingerprint`, building it if missing.

    Builds into a temporary sibling and renames it into place, so concurrent callers
    (pytest-xdist workers, several CI jobs) never see a half-written directory.
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return publish_cached(root / f"tiny-model-{source_fingerprint()}", build_tiny_model)


def publish_cached(target: Path, build: Callable[[Path], None]) -> Path:
    """`target` if a build is already there, else `build` into a temporary sibling renamed
    into place, so concurrent callers never see a half-written model directory (a lost
    rename race is fine: the winner's build is the same recipe)."""
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
