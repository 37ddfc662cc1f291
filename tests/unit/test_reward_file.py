"""Reading a verifier's reward files (`hooks.reward_file`): Harbor's precedence, the
declared range, and every bad case refused."""

from __future__ import annotations

import pytest

from hooks.reward_file import (
    MAX_REWARD_FILE_BYTES,
    RewardFileError,
    RewardOutOfRange,
    parse_reward_json,
    parse_reward_txt,
    read_reward_files,
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


def test_parsing_keeps_any_number_for_the_range_check() -> None:
    assert parse_reward_txt(b"7.5") == 7.5
    assert parse_reward_json(b'{"reward": -3}')[0] == -3.0
    # Too large for a float: infinite, which no range holds.
    assert parse_reward_txt(b"1e400") == float("inf")
    assert parse_reward_json(b'{"reward": -1e400}')[0] == float("-inf")
    assert parse_reward_json(b'{"reward": 1' + b"0" * 400 + b"}")[0] == float("inf")


def test_reward_txt_decides_over_reward_json() -> None:
    """Harbor's precedence: a program the verifier runs writes reward.json 1.0, the
    verifier writes reward.txt 0 afterwards — the txt is the reward; the JSON's other
    metrics are kept, its disagreeing reward noted."""
    got = read_reward_files(b"0\n", b'{"reward": 1.0, "passed": 3, "total": 6}')
    assert (got.reward, got.source) == (0.0, "reward.txt")
    assert got.metrics == {"passed": 3.0, "total": 6.0}
    assert got.notes == ["reward.json says reward=1.0; reward.txt decides (Harbor's precedence)"]


def test_reward_json_alone_decides() -> None:
    got = read_reward_files(None, b'{"reward": 0.5, "ratio": 0.5}')
    assert (got.reward, got.source, got.metrics, got.notes) == (
        0.5,
        "reward.json",
        {"ratio": 0.5},
        [],
    )


def test_a_bad_reward_json_beside_the_txt_is_skipped_and_noted() -> None:
    got = read_reward_files(b"1", b'{"reward": 1, "note": "text"}')
    assert (got.reward, got.source, got.metrics) == (1.0, "reward.txt", {})
    assert len(got.notes) == 1 and "reward.json skipped" in got.notes[0], got.notes
    assert "not a number" in got.notes[0]


def test_agreeing_files_leave_no_note() -> None:
    got = read_reward_files(b"1", b'{"reward": 1, "x": 2}')
    assert (got.reward, got.metrics, got.notes) == (1.0, {"x": 2.0}, [])


def test_no_reward_file_is_refused() -> None:
    with pytest.raises(RewardFileError, match=r"neither reward\.txt nor reward\.json"):
        read_reward_files(None, None)


@pytest.mark.parametrize(
    "txt,data,reward_range",
    [
        (b"1e308", None, (0.0, 1.0)),
        (b"-5", None, (0.0, 1.0)),
        (b"2.0", None, (0.0, 1.0)),
        (b"1.0000001", None, (0.0, 1.0)),
        (b"1e400", None, (0.0, 1.0)),
        (None, b'{"reward": 1e400}', (0.0, 1.0)),
        (None, b'{"reward": -0.5}', (0.0, 1.0)),
        (b"11", b'{"reward": 1}', (0.0, 10.0)),
        (b"-1", None, (0.0, 10.0)),
    ],
)
def test_a_reward_outside_the_range_is_refused_as_out_of_range(
    txt: bytes | None, data: bytes | None, reward_range: tuple[float, float]
) -> None:
    with pytest.raises(RewardOutOfRange, match=r"outside the task's range"):
        read_reward_files(txt, data, reward_range=reward_range)


@pytest.mark.parametrize(
    "txt,reward_range,want",
    [
        (b"0", (0.0, 1.0), 0.0),
        (b"1", (0.0, 1.0), 1.0),
        (b"0.25", (0.0, 1.0), 0.25),
        (b"7.5", (0.0, 10.0), 7.5),
        (b"-3", (-5.0, 5.0), -3.0),
    ],
)
def test_a_reward_in_the_range_is_the_reward(
    txt: bytes, reward_range: tuple[float, float], want: float
) -> None:
    assert read_reward_files(txt, None, reward_range=reward_range).reward == want


def test_a_range_must_be_finite_and_ordered() -> None:
    from pydantic import ValidationError

    from schemas.evaluation import RewardFileCheck

    assert RewardFileCheck(reward_range=(0, 10)).reward_range == (0.0, 10.0)
    for bad in [(1.0, 1.0), (1.0, 0.0), (0.0, float("inf")), (float("nan"), 1.0)]:
        with pytest.raises(ValidationError, match="low < high"):
            RewardFileCheck(reward_range=bad)


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
        (b'{"reward": 1, "x": 1e400}', "not finite"),
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
        (b"\xff\xfe1", "not UTF-8"),
        (b"1" + b" " * MAX_REWARD_FILE_BYTES, "larger than"),
    ],
)
def test_bad_txt(data: bytes, why: str) -> None:
    with pytest.raises(RewardFileError, match=why):
        parse_reward_txt(data)
