"""A segment's tokens as the rollout page shows them, one page at a time.

The sequence is the segment's first prompt, then its response: each call's sampled
tokens (loss mask 1, with the engine's logprob) followed by what came back before the
next call (tool results, the next user turn; mask 0). Pages keep a 100k-token rollout
as fast to open as a small one; text comes from a tokenizer when one is given.
"""

from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from rollout_client.samples_reader import SegmentView
from viewer.text import clip

PAGE_TOKENS = 2000
#: Heat buckets: a sampled token's logprob in steps of this many nats (last is "below").
HEAT_STEP = 0.5
HEAT_BUCKETS = 10


@dataclass
class Token:
    index: int
    id: int
    text: str
    trained: bool
    logprob: float | None
    version: str
    heat: int | None

    @property
    def readout(self) -> str:
        lp = "-" if self.logprob is None else f"{self.logprob:.4f}"
        return f"#{self.index} id {self.id} · {self.text!r} · logprob {lp} · policy {self.version}"


@dataclass
class Block:
    """A run of tokens with one heading: the prompt, or one call and what followed it."""

    title: str
    tokens: list[Token] = field(default_factory=list)


@dataclass
class TokenPage:
    page: int
    pages: int
    total: int
    blocks: list[Block]


def load_tokenizer(path: Path) -> Tokenizer:
    """A `tokenizer.json`, or a model directory holding one."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"--tokenizer {path}: expected a tokenizer.json or a directory with one")
    return Tokenizer.from_file(str(file))


def heat(logprob: float) -> int:
    return min(HEAT_BUCKETS - 1, int(-min(logprob, 0.0) / HEAT_STEP))


def token_page(seg: SegmentView, page: int, tokenizer: Tokenizer | None) -> TokenPage:
    """Tokens `page * PAGE_TOKENS` onward of the segment's prompt + response."""
    n_prompt = len(seg.prompt_ids)
    total = n_prompt + len(seg.response_ids)
    pages = max(1, -(-total // PAGE_TOKENS))
    page = min(max(page, 0), pages - 1)
    lo, hi = page * PAGE_TOKENS, min(total, (page + 1) * PAGE_TOKENS)
    ids = seg.prompt_ids[lo : min(hi, n_prompt)]
    ids += seg.response_ids[max(0, lo - n_prompt) : max(0, hi - n_prompt)]
    texts = _texts(ids, tokenizer)
    starts = [c.start for c in seg.calls] or [0]
    blocks: list[Block] = []
    current = -2  # -1: the prompt, i ≥ 0: call i
    for k, i in enumerate(range(lo, hi)):
        if i < n_prompt:
            call, token = -1, Token(i, ids[k], texts[k], False, None, "", None)
        else:
            r = i - n_prompt
            call = max(0, bisect_right(starts, r) - 1)
            trained = seg.loss_mask[r] == 1
            lp = seg.logprobs[r] if trained else None
            version = seg.token_versions[r] if r < len(seg.token_versions) else ""
            token = Token(
                i, ids[k], texts[k], trained, lp, version, None if lp is None else heat(lp)
            )
        if call != current:
            current = call
            title = "prompt"
            if call >= 0 and seg.calls:
                title = (
                    f"call {call + 1} of {len(seg.calls)} · policy {seg.calls[call].policy_version}"
                )
            blocks.append(Block(title))
        blocks[-1].tokens.append(token)
    return TokenPage(page, pages, total, blocks)


def _texts(ids: list[int], tokenizer: Tokenizer | None) -> list[str]:
    if tokenizer is None:
        return [f"⟨{i}⟩" for i in ids]
    return [
        clip(t, 200) for t in tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    ]
