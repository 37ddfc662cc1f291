"""Opaque tokens are sealed to their session: only the seal that minted one reads it back.

Each refusal has its control (the minting seal reads the same token), so a refusal shows
the binding, not a token that never decodes.
"""

import base64

import pytest

from gateway.errors import GatewayError
from gateway.protocols.opaque_token import TokenSeal, open_token

SECRET = b"s" * 32
WHERE = "input[1].encrypted_content"


def seal(session_id: str = "s1", secret: bytes = SECRET) -> TokenSeal:
    return TokenSeal.for_session(secret, session_id)


def refused(reader: TokenSeal | None, token: str) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        open_token(reader, token, "reasoning", WHERE)
    assert caught.value.status == 400 and caught.value.param == WHERE
    return caught.value


def test_round_trip_is_deterministic_in_session_call_and_text() -> None:
    token = seal().encode("reasoning", "c1", "think → ok")
    assert token == seal().encode("reasoning", "c1", "think → ok")
    assert seal().decode(token, "reasoning", WHERE) == ("c1", "think → ok")
    assert seal().decode(token, "thinking", WHERE) is None  # ours, of another kind


@pytest.mark.parametrize(
    "reader",
    [
        pytest.param(seal("s2"), id="another-session"),
        pytest.param(seal(secret=b"t" * 32), id="another-gateway-data-dir"),
        pytest.param(None, id="no-session"),
    ],
)
def test_a_token_minted_elsewhere_is_refused(reader: TokenSeal | None) -> None:
    token = seal().encode("reasoning", "c1", "secret plan")
    assert open_token(seal(), token, "reasoning", WHERE) == ("c1", "secret plan")  # control
    refused(reader, token)


def test_an_altered_or_unsealed_token_is_refused() -> None:
    token = seal().encode("reasoning", "c1", "a")
    body, mac = token.removeprefix("rollout2.").rsplit(".", 1)
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).replace(b'"a"', b'"b"')
    edited = "rollout2." + base64.urlsafe_b64encode(raw).decode().rstrip("=") + "." + mac
    refused(seal(), edited)
    refused(seal(), token.rsplit(".", 1)[0])  # the MAC dropped
    refused(seal(), "rollout1." + body)  # the unsealed format an older gateway issued


@pytest.mark.parametrize("token", [None, "", "gAAAA-foreign", "EmwKAhgBEgy-foreign"])
def test_a_token_not_in_our_format_is_ignored(token: str | None) -> None:
    assert open_token(seal(), token, "reasoning", WHERE) is None
    assert open_token(None, token, "reasoning", WHERE) is None
