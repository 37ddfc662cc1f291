"""Reading the reward a verifier wrote to a file (Harbor's contract, `RewardFileCheck`).

Pure parsing, no sandbox: the `evaluate` hook runs the verifier and hands the bytes
here (`read_reward_files`). The rules, strict on purpose — a reward the trainer learns
from must be exactly what the verifier meant:

* ``reward.txt`` decides when it is there, as in Harbor: one decimal number
  (surrounding whitespace allowed). A ``reward.json`` beside it gives only its other
  metrics; its own reward key is ignored (a program the verifier runs may write either
  file, and the txt is what Harbor scores), and a JSON that is not what the contract
  says is skipped, with a note in the check's detail.
* else ``reward.json``: a JSON object whose values are all numbers (not booleans, not
  strings, no NaN/Infinity); `reward_key` is the reward, every other key a metric.
* A file over `MAX_REWARD_FILE_BYTES`, empty, or not UTF-8, a non-number, or a
  non-finite metric is `RewardFileError`: the verifier gave no reward.
* The reward has a declared range (`RewardFileCheck.reward_range`, default [0, 1]). A
  number outside it (1e308, -5, 2.0, one too large for a float) is
  `RewardOutOfRange`: no verifier of the task writes it, so it is the doing of the code
  under test (the agent's failure, reward 0), never a reward.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

#: Largest reward file read out of a sandbox (a few metrics take a few hundred bytes).
MAX_REWARD_FILE_BYTES = 256 * 1024
REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
#: One plain decimal number, as verifiers print them (no ``nan``, ``inf``, ``1_0``).
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


class RewardFileError(ValueError):
    """The reward file is missing, empty, too large, or not what the contract says."""


class RewardOutOfRange(RewardFileError):
    """The reward is a number outside the task's declared range."""


@dataclass
class RewardReading:
    """What the reward files said: the reward, the other metrics, which file decided."""

    reward: float
    source: str
    metrics: dict[str, float] = field(default_factory=dict)
    #: What was read but not used (a reward.json beside the reward.txt), for the detail.
    notes: list[str] = field(default_factory=list)


def _text(data: bytes, name: str) -> str:
    if len(data) > MAX_REWARD_FILE_BYTES:
        raise RewardFileError(f"{name} is larger than {MAX_REWARD_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RewardFileError(f"{name} is not UTF-8 text ({e})") from e
    if not text.strip():
        raise RewardFileError(f"{name} is empty")
    return text


def _number(value: Any, where: str) -> float:
    """`value` as a float if it is a JSON number (not a bool); inf when too large."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardFileError(f"{where} is not a number: {json.dumps(value)[:100]}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _finite(value: Any, where: str) -> float:
    f = _number(value, where)
    if not math.isfinite(f):
        raise RewardFileError(f"{where} is not finite ({str(value)[:100]})")
    return f


def _no_constants(name: str) -> float:
    raise RewardFileError(f"{REWARD_JSON} holds {name}, which is not a number")


def _json_object(data: bytes) -> dict[str, Any]:
    text = _text(data, REWARD_JSON)
    try:
        payload = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        raise RewardFileError(f"{REWARD_JSON} is not valid JSON ({e})") from e
    if not isinstance(payload, dict):
        raise RewardFileError(f"{REWARD_JSON} is not a JSON object of metrics")
    return payload


def _metrics(payload: dict[str, Any], reward_key: str) -> dict[str, float]:
    """Every key of a ``reward.json`` but the reward, each a finite number."""
    return {
        str(k): _finite(v, f"{REWARD_JSON} key {k!r}")
        for k, v in payload.items()
        if k != reward_key
    }


def parse_reward_json(data: bytes, reward_key: str = "reward") -> tuple[float, dict[str, float]]:
    """(reward, the other metrics) from a ``reward.json``'s bytes. The reward may be
    any number (inf when too large for a float: the range check refuses it); the
    metrics must be finite."""
    payload = _json_object(data)
    if reward_key not in payload:
        raise RewardFileError(
            f"{REWARD_JSON} has no {reward_key!r} key (the reward); keys: {sorted(payload)[:20]}"
        )
    reward = _number(payload[reward_key], f"{REWARD_JSON} key {reward_key!r}")
    return reward, _metrics(payload, reward_key)


def parse_reward_txt(data: bytes) -> float:
    """The reward from a ``reward.txt``'s bytes: one number (inf when too large)."""
    text = _text(data, REWARD_TXT).strip()
    if not _NUMBER.fullmatch(text):
        raise RewardFileError(f"{REWARD_TXT} is not one number: {text[:100]!r}")
    return float(text)


def _beside_txt(reading: RewardReading, data: bytes, reward_key: str) -> None:
    """A ``reward.json`` next to the deciding ``reward.txt``: its metrics, and notes on
    what is not used."""
    try:
        payload = _json_object(data)
        reading.metrics = _metrics(payload, reward_key)
    except RewardFileError as e:
        reading.notes.append(f"{REWARD_JSON} skipped, its metrics not kept: {e}")
        return
    other = payload.get(reward_key)
    if other is not None and other != reading.reward:
        reading.notes.append(
            f"{REWARD_JSON} says {reward_key}={json.dumps(other)[:50]}; "
            f"{REWARD_TXT} decides (Harbor's precedence)"
        )


def read_reward_files(
    txt: bytes | None,
    json_data: bytes | None,
    reward_key: str = "reward",
    reward_range: tuple[float, float] = (0.0, 1.0),
) -> RewardReading:
    """The reward from the bytes of ``reward.txt`` and ``reward.json`` (None: absent),
    by Harbor's precedence; `RewardFileError` when they give none, `RewardOutOfRange`
    when it lies outside the closed `reward_range`."""
    if txt is not None:
        reading = RewardReading(reward=parse_reward_txt(txt), source=REWARD_TXT)
        if json_data is not None:
            _beside_txt(reading, json_data, reward_key)
    elif json_data is not None:
        reward, metrics = parse_reward_json(json_data, reward_key)
        reading = RewardReading(reward=reward, source=REWARD_JSON, metrics=metrics)
    else:
        raise RewardFileError(f"it wrote neither {REWARD_TXT} nor {REWARD_JSON}")
    low, high = reward_range
    if not low <= reading.reward <= high:  # ±inf too
        raise RewardOutOfRange(
            f"{reading.source} holds reward {reading.reward!r}, outside the task's range "
            f"[{low}, {high}]"
        )
    return reading
