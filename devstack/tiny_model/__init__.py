"""The project's own tiny model for tests, benchmarks and the demo.

No GPU, no weight downloads and no third-party corpora or templates: this package
generates a corpus from its own word lists (``words/*.txt``), trains a byte-level BPE
tokenizer on it (with CJK merges), ships its own Qwen3-style chat template and writes
random Qwen3-architecture weights that vLLM's CPU build can serve. Needs numpy,
tokenizers, safetensors, jinja2 and pydantic -- never torch. Of the rest of the project
it imports only the Gateway's Jinja environment (``gateway.prompt.jinja_env``), so its
template renders as the Gateway renders it.
"""

from .builder import (
    SERVED_MODEL_NAME,
    FileDigest,
    TinyModelInfo,
    build_tiny_model,
    default_cache_dir,
    ensure_tiny_model,
    source_fingerprint,
)
from .template import chat_template_sha256, chat_template_text, render_chat
from .tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    ReencodeExample,
    find_reencode_divergence,
)

__all__ = [
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "MARKUP_TOKENS",
    "SERVED_MODEL_NAME",
    "SPECIAL_TOKENS",
    "FileDigest",
    "ReencodeExample",
    "TinyModelInfo",
    "build_tiny_model",
    "chat_template_sha256",
    "chat_template_text",
    "default_cache_dir",
    "ensure_tiny_model",
    "find_reencode_divergence",
    "render_chat",
    "source_fingerprint",
]
