"""The payload codec alone: round trip, key rotation, plain payloads passing through,
and clear errors for a wrong key, a tampered payload and a malformed key."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload

from rollout_client.codec import (
    EncryptionCodec,
    PayloadKeyError,
    key_id,
    load_keys,
    new_key,
    parse_key,
)

TOKEN = b'{"token": "s1.very-secret-token-value"}'


def payload(data: bytes = TOKEN) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


async def test_round_trip_hides_the_bytes_and_restores_the_payload() -> None:
    key = parse_key(new_key())
    codec = EncryptionCodec([key])
    [sealed] = await codec.encode([payload()])
    assert b"very-secret" not in sealed.SerializeToString()
    assert sealed.metadata["encryption-key-id"] == key_id(key).encode()
    assert await codec.decode([sealed]) == [payload()]
    [again] = await codec.encode([payload()])
    assert again.data != sealed.data  # a fresh nonce every time


async def test_rotation_old_key_still_decrypts_new_key_encrypts() -> None:
    old, new = parse_key(new_key()), parse_key(new_key())
    [by_old] = await EncryptionCodec([old]).encode([payload()])
    rotated = EncryptionCodec([new, old])
    assert await rotated.decode([by_old]) == [payload()]
    [by_new] = await rotated.encode([payload()])
    assert by_new.metadata["encryption-key-id"] == key_id(new).encode()


async def test_plain_payloads_pass_through() -> None:
    codec = EncryptionCodec([parse_key(new_key())])
    assert await codec.decode([payload()]) == [payload()]


async def test_wrong_key_names_both_key_ids() -> None:
    a, b = parse_key(new_key()), parse_key(new_key())
    [sealed] = await EncryptionCodec([a]).encode([payload()])
    with pytest.raises(PayloadKeyError) as info:
        await EncryptionCodec([b]).decode([sealed])
    assert str(info.value).startswith(
        f"payload encrypted with key id '{key_id(a)}'; this process has key id(s) ['{key_id(b)}']"
    )


async def test_tampered_payload_is_refused() -> None:
    key = parse_key(new_key())
    codec = EncryptionCodec([key])
    [sealed] = await codec.encode([payload()])
    sealed.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    with pytest.raises(PayloadKeyError, match="does not decrypt"):
        await codec.decode([sealed])


@pytest.mark.parametrize(("text", "why"), [("not base64!!", "not base64"), ("c2hvcnQ=", "got 5")])
def test_malformed_keys_are_refused(text: str, why: str) -> None:
    with pytest.raises(PayloadKeyError, match=why):
        parse_key(text)


def test_load_keys_file_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLOUT_PAYLOAD_KEY", raising=False)
    monkeypatch.delenv("ROLLOUT_PAYLOAD_KEY_FILE", raising=False)
    assert load_keys() == []
    first, second = new_key(), new_key()
    f = tmp_path / "keys"
    f.write_text(f"{first}\n\n{second}\n")
    assert load_keys(f) == [parse_key(first), parse_key(second)]
    monkeypatch.setenv("ROLLOUT_PAYLOAD_KEY_FILE", str(f))
    assert load_keys()[0] == parse_key(first)
    monkeypatch.delenv("ROLLOUT_PAYLOAD_KEY_FILE")
    monkeypatch.setenv("ROLLOUT_PAYLOAD_KEY", second)
    assert load_keys() == [parse_key(second)]
