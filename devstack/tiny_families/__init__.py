"""Tiny models of published model families: the tiny model's BPE and random weights with
a family's structural tokens, its real chat template and its end-of-turn ids, so the
Gateway and vLLM CPU meet each family's format without downloading a model."""

from .builder import (
    FamilyModelInfo,
    build_family_model,
    ensure_family_model,
    family_fingerprint,
    served_model_name,
    train_family_tokenizer,
)
from .catalog import TokenFamily, UnknownFamily, families, family_names, get_family

__all__ = [
    "FamilyModelInfo",
    "TokenFamily",
    "UnknownFamily",
    "build_family_model",
    "ensure_family_model",
    "families",
    "family_fingerprint",
    "family_names",
    "get_family",
    "served_model_name",
    "train_family_tokenizer",
]
