"""Encryption of everything this system stores in Temporal (a `PayloadCodec`, AES-GCM).

Why every payload and not only the ones with a session token: activity inputs carry the
session (its token is the agent's API key), tasks may carry credentials in their env,
and a new field must never leak by default. What operators filter and look at first
stays readable without the key: search attributes (phase, status, sandbox host, reward,
batch/task ids) are not encoded by codecs. To read the rest, give the Temporal UI or CLI
the codec endpoint of `rollout codec-server` (see docs/payload-encryption.md), or use
`temporal workflow show --codec-endpoint`.

Wire format of an encrypted payload: metadata ``encoding = binary/encrypted`` and
``encryption-key-id`` (first 16 hex digits of the key's SHA-256, so a wrong key is named,
never guessed); data = 12-byte nonce + AES-256-GCM(serialized original payload). The
first key encrypts; every key given decrypts (rotation: add the new key first, keep the
old one until no history needs it). Payloads that are not encrypted pass through, so
histories written before the codec was turned on stay readable.
"""

import base64
import binascii
import dataclasses
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
#: Binds ciphertexts to this use, so a blob from elsewhere cannot be passed off as one.
_AAD = b"agentic-rollout/temporal-payload/v1"
#: Environment variable holding a key (base64) when no key file is given.
KEY_ENV = "ROLLOUT_PAYLOAD_KEY"
KEY_FILE_ENV = "ROLLOUT_PAYLOAD_KEY_FILE"


class PayloadKeyError(ValueError):
    """A payload key is malformed, or a payload cannot be decrypted with the keys given."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def parse_key(text: str, source: str = "key") -> bytes:
    """A 256-bit key from its base64 text (standard or URL-safe alphabet)."""
    raw = text.strip()
    try:
        key = base64.urlsafe_b64decode(raw.replace("+", "-").replace("/", "_"))
    except (binascii.Error, ValueError) as exc:
        raise PayloadKeyError(f"{source}: not base64 ({exc})") from None
    if len(key) != 32:
        raise PayloadKeyError(f"{source}: a payload key is 32 bytes (base64), got {len(key)}")
    return key


def new_key() -> str:
    """A fresh key as base64 text (what `rollout keygen` writes)."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def load_keys(key_file: Path | str | None = None) -> list[bytes]:
    """Keys from a file (one base64 key per line, the first encrypts); without one, from
    the file named by `ROLLOUT_PAYLOAD_KEY_FILE` or the key in `ROLLOUT_PAYLOAD_KEY`;
    [] when none is set (no encryption)."""
    key_file = key_file or os.environ.get(KEY_FILE_ENV) or None
    if key_file is not None:
        lines = [ln for ln in Path(key_file).read_text().splitlines() if ln.strip()]
        if not lines:
            raise PayloadKeyError(f"{key_file}: no key in the file")
        return [parse_key(ln, f"{key_file}:{i}") for i, ln in enumerate(lines, 1)]
    env = os.environ.get(KEY_ENV)
    return [parse_key(env, KEY_ENV)] if env else []


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over whole payloads; see the module docstring for the format."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not keys:
            raise PayloadKeyError("EncryptionCodec needs at least one key")
        self._encrypt_id = key_id(keys[0])
        self._ciphers = {key_id(k): AESGCM(k) for k in keys}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        cipher = self._ciphers[self._encrypt_id]
        out: list[Payload] = []
        for p in payloads:
            nonce = os.urandom(12)
            sealed = cipher.encrypt(nonce, p.SerializeToString(), _AAD)
            out.append(
                Payload(
                    metadata={"encoding": ENCODING, KEY_ID: self._encrypt_id.encode()},
                    data=nonce + sealed,
                )
            )
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        from cryptography.exceptions import InvalidTag

        out: list[Payload] = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)
                continue
            kid = p.metadata.get(KEY_ID, b"").decode(errors="replace")
            cipher = self._ciphers.get(kid)
            if cipher is None:
                raise PayloadKeyError(
                    f"payload encrypted with key id {kid!r}; this process has key id(s) "
                    f"{sorted(self._ciphers)} (check --payload-key-file / {KEY_ENV})"
                )
            try:
                plain = cipher.decrypt(p.data[:12], p.data[12:], _AAD)
            except InvalidTag:
                raise PayloadKeyError(
                    f"payload with key id {kid!r} does not decrypt: altered, or a different "
                    "key with a colliding id"
                ) from None
            decoded = Payload()
            decoded.ParseFromString(plain)
            out.append(decoded)
        return out


def data_converter(keys: Sequence[bytes] = ()) -> DataConverter:
    """The converter every client and worker of this system uses: pydantic JSON, plus
    encryption when keys are given."""
    from temporalio.contrib.pydantic import pydantic_data_converter

    if not keys:
        return pydantic_data_converter
    return dataclasses.replace(pydantic_data_converter, payload_codec=EncryptionCodec(keys))
