"""Reading the reward a verifier wrote to a file (Harbor's contract, `RewardFileCheck`).

Pure parsing, no sandbox: the `evaluate` hook runs the verifier and hands the bytes
here. The rules, strict on purpose — a reward the trainer learns from must be exactly
what the verifier meant, so anything doubtful is `RewardFileError` (an evaluator error,
never a 0):

* ``reward.json`` (read when present): a JSON object whose values are all finite
  numbers (not booleans, not strings, no NaN/Infinity); `reward_key` is the reward,
  every other key a metric recorded with the sample.
* else ``reward.txt``: one decimal number (surrounding whitespace allowed), finite.
* A file over `MAX_REWARD_FILE_BYTES`, empty, or not UTF-8 is refused.

A reward outside [0, 1] is kept as written: Harbor allows any float, and a task's own
scale (a score out of 10, a negative penalty) is its author's choice.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Largest reward file read out of a sandbox (a few metrics take a few hundred bytes).
MAX_REWARD_FILE_BYTES = 256 * 1024
REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"
#: One plain decimal number, as verifiers print them (no ``nan``, ``inf``, ``1_0``).
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


class RewardFileError(ValueError):
    """The reward file is missing, empty, too large, or not what the contract says."""


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


def _finite(value: Any, where: str) -> float:
    """`value` as a float if it is a JSON number (not a bool) and finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardFileError(f"{where} is not a number: {json.dumps(value)[:100]}")
    try:
        f = float(value)
    except OverflowError as e:
        raise RewardFileError(f"{where} is too large for a float") from e
    if not math.isfinite(f):
        raise RewardFileError(f"{where} is not finite ({value})")
    return f


def _no_constants(name: str) -> float:
    raise RewardFileError(f"{REWARD_JSON} holds {name}, which is not a number")


def parse_reward_json(data: bytes, reward_key: str = "reward") -> tuple[float, dict[str, float]]:
    """(reward, the other metrics) from a ``reward.json``'s bytes."""
    text = _text(data, REWARD_JSON)
    try:
        payload = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        raise RewardFileError(f"{REWARD_JSON} is not valid JSON ({e})") from e
    if not isinstance(payload, dict):
        raise RewardFileError(f"{REWARD_JSON} is not a JSON object of metrics")
    metrics = {str(k): _finite(v, f"{REWARD_JSON} key {k!r}") for k, v in payload.items()}
    if reward_key not in metrics:
        raise RewardFileError(
            f"{REWARD_JSON} has no {reward_key!r} key (the reward); keys: {sorted(metrics)[:20]}"
        )
    reward = metrics.pop(reward_key)
    return reward, metrics


def parse_reward_txt(data: bytes) -> float:
    """The reward from a ``reward.txt``'s bytes: one number."""
    text = _text(data, REWARD_TXT).strip()
    if not _NUMBER.fullmatch(text):
        raise RewardFileError(f"{REWARD_TXT} is not one number: {text[:100]!r}")
    return _finite(float(text), REWARD_TXT)
