"""Opaque tokens that carry our own text through a client and back.

Clients echo what we returned (Codex a reasoning item's `encrypted_content`, Claude Code a
thinking block's `signature`) but may drop the readable copy, e.g. thinking shown as
`omitted`. The token is deterministic in the call id and the text, so the echoed history
renders exactly as the model produced it. Tokens issued by anyone else decode to None.
"""

from __future__ import annotations

import base64
import binascii
import json

from gateway import json_text

_TOKEN_PREFIX = "rollout1."


def encode_token(kind: str, call_id: str, text: str) -> str:
    """A token of this `kind` (e.g. `reasoning`, `thinking`, `compaction`) carrying `text`."""
    raw = json.dumps({"k": kind, "c": call_id, "t": text}, ensure_ascii=False)
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str | None, kind: str) -> tuple[str, str] | None:
    """`(call_id, text)` of a token we issued with this kind; None for anything else."""
    if not token or not token.startswith(_TOKEN_PREFIX):
        return None
    body = token[len(_TOKEN_PREFIX) :]
    try:
        data = json_text.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, binascii.Error):  # also forged deep or surrogate-bearing JSON
        return None
    if not isinstance(data, dict) or data.get("k") != kind:
        return None
    call_id, text = data.get("c"), data.get("t")
    if not isinstance(call_id, str) or not isinstance(text, str):
        return None
    return call_id, text
