"""Build a tiny model of a published family: our BPE and weights, the family's tokens and
its real chat template (``rollout make-tiny-model DIR --family NAME``).

A separate package from ``devstack.tiny_model`` on purpose: that package's sources are
the default build's cache key (and the warm model's), so the family builder reuses its
corpus, weights and tokenizer settings without touching a byte of it.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from devstack.real_templates import read_template, sha256_hex, template_sources
from devstack.tiny_model import (
    FileDigest,
    TinyModelInfo,
    default_cache_dir,
    find_reencode_divergence,
    source_fingerprint,
)
from devstack.tiny_model.builder import publish_cached
from devstack.tiny_model.corpus import generate_corpus
from devstack.tiny_model.tokenizer import TARGET_VOCAB, padded_vocab_size
from devstack.tiny_model.weights import TinyQwen3Shape, hf_config, init_weights, write_weights

from .catalog import TokenFamily, get_family

FILES = (
    "corpus.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "model.safetensors",
)


class FamilyModelInfo(TinyModelInfo):
    """What a family build produced, with the family's end-of-turn ids."""

    family: str
    served_model_name: str
    end_of_turn_ids: list[int]


def served_model_name(family: str) -> str:
    return f"tiny-{family}"


def train_family_tokenizer(family: TokenFamily, lines: list[str]) -> Tokenizer:
    """Our byte-level BPE (the default build's settings) plus the family's markers.

    The BPE fills the rest of the default build's vocabulary size (a multiple of 64), so
    every embedding row has a token: a random model samples every id sooner or later."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB - len(family.structural),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in family.control]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.markup])
    return tokenizer


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _digest(path: Path) -> FileDigest:
    data = path.read_bytes()
    return FileDigest(path=path, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def _ids(tokenizer: Tokenizer, tokens: tuple[str, ...]) -> list[int]:
    ids = [tokenizer.token_to_id(t) for t in tokens]
    if None in ids:
        raise RuntimeError(f"tokens missing from the built tokenizer: {tokens}")
    return [i for i in ids if i is not None]


def build_family_model(
    out_dir: Path, family: str, shape: TinyQwen3Shape | None = None
) -> FamilyModelInfo:
    """Write corpus, tokenizer, the family's real chat template, config and weights."""
    spec = get_family(family)
    template = read_template(spec.name)
    shape = shape or TinyQwen3Shape()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    corpus = generate_corpus()
    (out_dir / "corpus.txt").write_text(corpus, encoding="utf-8")
    tokenizer = train_family_tokenizer(spec, corpus.splitlines())
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)

    token_ids = dict(zip(spec.structural, _ids(tokenizer, spec.structural), strict=True))
    eos_id, pad_id = token_ids[spec.eos], token_ids[spec.pad]
    bos_id = token_ids[spec.bos] if spec.bos else pad_id
    end_ids = [token_ids[t] for t in spec.end_of_turn]
    vocab_size = padded_vocab_size(tokenizer)

    _write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": shape.max_position_embeddings,
            "bos_token": spec.bos,
            "eos_token": spec.eos,
            "pad_token": spec.pad,
            "unk_token": None,
            "additional_special_tokens": list(spec.control),
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "errors": "replace",
            "chat_template": template,
        },
    )
    _write_json(
        out_dir / "special_tokens_map.json",
        {
            "bos_token": spec.bos,
            "eos_token": spec.eos,
            "pad_token": spec.pad,
            "additional_special_tokens": list(spec.control),
        },
    )
    _write_json(out_dir / "config.json", hf_config(shape, vocab_size, eos_id, bos_id))
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": bos_id,
            "eos_token_id": end_ids if len(end_ids) > 1 else end_ids[0],
            "pad_token_id": pad_id,
        },
    )
    write_weights(out_dir / "model.safetensors", init_weights(shape, vocab_size))
    (out_dir / "model.safetensors").chmod(0o644)

    return FamilyModelInfo(
        out_dir=out_dir,
        files={n: _digest(out_dir / n) for n in FILES},
        tokenizer_size=tokenizer.get_vocab_size(with_added_tokens=True),
        vocab_size=vocab_size,
        token_ids=token_ids,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        chat_template_sha256=sha256_hex(template.encode()),
        reencode_example=find_reencode_divergence(tokenizer),
        family=spec.name,
        served_model_name=served_model_name(spec.name),
        end_of_turn_ids=end_ids,
    )


def family_fingerprint(family: str) -> str:
    """Cache key of a family build: the default build's sources, this package's sources,
    the family's catalog entry and its template's sha256 (from the pinned manifest, which
    `read_template` checks the file against)."""
    spec = get_family(family)
    digest = hashlib.sha256(source_fingerprint().encode())
    folder = resources.files(__package__)
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_file() and entry.name.endswith(".py"):
            digest.update(entry.name.encode())
            digest.update(entry.read_bytes())
    digest.update(spec.model_dump_json().encode())
    digest.update(template_sources()[spec.name].sha256.encode())
    return digest.hexdigest()[:16]


def ensure_family_model(family: str, cache_dir: Path | None = None) -> Path:
    """A cached build of `family` keyed by :func:`family_fingerprint`, built if missing
    (into a temporary sibling renamed into place, like the default tiny model)."""
    get_family(family)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / f"tiny-{family}-{family_fingerprint(family)}"
    return publish_cached(target, lambda out: build_family_model(out, family))
