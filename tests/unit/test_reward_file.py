"""Reading a verifier's reward file (`hooks.reward_file`): every bad case is refused."""

from __future__ import annotations

import pytest

from hooks.reward_file import (
    MAX_REWARD_FILE_BYTES,
    RewardFileError,
    parse_reward_json,
    parse_reward_txt,
)


def test_json_reward_and_metrics() -> None:
    reward, metrics = parse_reward_json(b'{"reward": 0.5, "passed": 3, "total": 6}')
    assert reward == 0.5
    assert metrics == {"passed": 3.0, "total": 6.0}


def test_json_other_reward_key() -> None:
    reward, metrics = parse_reward_json(b'{"score": 1, "reward": 0.2}', reward_key="score")
    assert (reward, metrics) == (1.0, {"reward": 0.2})


@pytest.mark.parametrize("text,value", [(" 1\n", 1.0), ("0.25", 0.25), ("-2e-1", -0.2)])
def test_txt_one_number(text: str, value: float) -> None:
    assert parse_reward_txt(text.encode()) == value


def test_reward_outside_unit_interval_is_kept() -> None:
    assert parse_reward_txt(b"7.5") == 7.5
    assert parse_reward_json(b'{"reward": -3}')[0] == -3.0


@pytest.mark.parametrize(
    "data,why",
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"{", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'"1.0"', "not a JSON object"),
        (b"{}", "no 'reward' key"),
        (b'{"passed": 1}', "no 'reward' key"),
        (b'{"reward": "1.0"}', "not a number"),
        (b'{"reward": true}', "not a number"),
        (b'{"reward": null}', "not a number"),
        (b'{"reward": 1, "notes": "fine"}', "not a number"),
        (b'{"reward": 1, "nested": {"a": 1}}', "not a number"),
        (b'{"reward": NaN}', "NaN"),
        (b'{"reward": Infinity}', "Infinity"),
        (b'{"reward": 1, "x": -Infinity}', "-Infinity"),
        (b'{"reward": 1e400}', "not finite"),
        (b'{"reward": 1' + b"0" * 400 + b"}", "too large"),
        (b'{"reward": 1}\xff', "not UTF-8"),
        (b'{"reward": 1, "pad": "' + b"x" * MAX_REWARD_FILE_BYTES + b'"}', "larger than"),
    ],
)
def test_bad_json(data: bytes, why: str) -> None:
    with pytest.raises(RewardFileError, match=why.replace("(", r"\(")):
        parse_reward_json(data)


@pytest.mark.parametrize(
    "data,why",
    [
        (b"", "empty"),
        (b"\n\t ", "empty"),
        (b"one", "not one number"),
        (b"1 2", "not one number"),
        (b"1\n2", "not one number"),
        (b"nan", "not one number"),
        (b"inf", "not one number"),
        (b"1_0", "not one number"),
        (b"0x1", "not one number"),
        (b'{"reward": 1}', "not one number"),
        (b"1e400", "not finite"),
        (b"\xff\xfe1", "not UTF-8"),
        (b"1" + b" " * MAX_REWARD_FILE_BYTES, "larger than"),
    ],
)
def test_bad_txt(data: bytes, why: str) -> None:
    with pytest.raises(RewardFileError, match=why):
        parse_reward_txt(data)
