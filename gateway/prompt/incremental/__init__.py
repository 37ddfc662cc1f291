"""Incremental tokenization with held tokens: reuse the ids already sent and sampled, and
tokenize only the text a request adds after our previous reply. Pure logic: no I/O.

Modules, each importing only those listed before it: `tokenizer_adapter`, `message_keys`,
`normalisers`, `held_segments`, `markers`, `matching`, `boundary`, `window`,
`probe_corpus`, `window_probe`, `planner`. The design is described in docs/incremental.md.
"""

from gateway.prompt.incremental.held_segments import HeldSegment, SegmentView
from gateway.prompt.incremental.normalisers import DEFAULT_NORMALISERS, Normaliser
from gateway.prompt.incremental.planner import IncrementalTokenizer, PromptPlan
from gateway.prompt.incremental.tokenizer_adapter import Tokenizer, load_tokenizer
from gateway.prompt.incremental.window_probe import WindowDecision

__all__ = [
    "DEFAULT_NORMALISERS",
    "HeldSegment",
    "IncrementalTokenizer",
    "Normaliser",
    "PromptPlan",
    "SegmentView",
    "Tokenizer",
    "WindowDecision",
    "load_tokenizer",
]
