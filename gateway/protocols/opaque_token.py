"""Opaque tokens that carry our own text through a client and back, sealed to a session.

Clients echo what we returned (Codex a reasoning item's `encrypted_content`, Claude Code a
thinking block's `signature`) but may drop the readable copy, e.g. thinking shown as
`omitted`. The token is deterministic in the session, the call id and the text, so the
echoed history renders exactly as the model produced it.

Each session has its own `TokenSeal`: an HMAC key derived from the gateway's data-dir
secret and the session id, so every process of a gateway (and the same gateway after a
restart) checks the tokens it issued, while a token minted for another session, by a
gateway on another data dir, or edited by hand is refused with a 400 naming the field.
The text is signed, not hidden: the agent saw it in the reply anyway. Tokens that are not
ours at all (another provider's signatures) are ignored, as a client's opaque blob.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re

from gateway import json_text
from gateway.errors import GatewayError
from gateway.protocols.wire import bad_request

_PREFIX = "rollout2."
#: Any version of our format: an older or forged one is refused, never read.
_OURS = re.compile(r"rollout\d+\.")
_MAC_BYTES = 16


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSeal:
    """Mints and checks one session's opaque tokens (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def for_session(cls, secret: bytes, session_id: str) -> TokenSeal:
        """The seal of `session_id` under a gateway data dir's `secret`."""
        key = hmac.new(secret, b"opaque-token:" + session_id.encode(), hashlib.sha256)
        return cls(key.digest())

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._key, (_PREFIX + body).encode(), hashlib.sha256).digest()
        return _b64(digest[:_MAC_BYTES])

    def encode(self, kind: str, call_id: str, text: str) -> str:
        """A token of this `kind` (e.g. `reasoning`, `thinking`, `compaction`) carrying
        `text`."""
        raw = json.dumps({"k": kind, "c": call_id, "t": text}, ensure_ascii=False)
        body = _b64(raw.encode())
        return f"{_PREFIX}{body}.{self._mac(body)}"

    def decode(self, token: str | None, kind: str, where: str) -> tuple[str, str] | None:
        """`(call_id, text)` of a token this seal issued with this kind; None for a token
        that is not ours (or ours of another kind). GatewayError(400) at `where` for one
        in our format that this session's seal did not issue."""
        if not token or not _OURS.match(token):
            return None
        body, dot, mac = token[len(_PREFIX) :].rpartition(".")
        if (
            not token.startswith(_PREFIX)
            or not dot
            or not hmac.compare_digest(mac, self._mac(body))
        ):
            raise refused(where)
        try:
            data = json_text.loads(_unb64(body))
        except (ValueError, binascii.Error):  # only if our own format broke
            raise refused(where) from None
        if not isinstance(data, dict) or data.get("k") != kind:
            return None
        call_id, text = data.get("c"), data.get("t")
        if not isinstance(call_id, str) or not isinstance(text, str):
            raise refused(where)
        return call_id, text


def open_token(
    seal: TokenSeal | None, token: str | None, kind: str, where: str
) -> tuple[str, str] | None:
    """`seal.decode`, where no seal (a request parsed outside any session) refuses every
    token in our format: none was issued for it."""
    if seal is not None:
        return seal.decode(token, kind, where)
    if token and _OURS.match(token):
        raise refused(where)
    return None


def refused(where: str) -> GatewayError:
    return bad_request(
        where,
        "this token was not issued for this session by this gateway (another session's, "
        "another gateway's, or altered); send the item as this session's reply gave it",
    )
