"""An engine's routed experts, decoded and checked against the call they belong to.

vLLM (>= 0.32, `--enable-return-routed-experts`, token-in/token-out endpoint) sends them
as base64 of an `.npy` array of shape (tokens - 1 - start, layers, top_k): the prompt
from `routed_experts_prompt_start` on, then the sampled tokens but the last (never read
back). SGLang (`--enable-return-routed-experts`, `return_routed_experts` per request)
sends base64 of the raw int32 ids of the whole prompt and output but the last token,
without their shape. Routing is training data, not the reply: what is missing or
malformed never fails the call; it comes back as the reason the call has none.
"""

import base64
import binascii
import io

import numpy as np

from schemas.routing import RoutedExperts

Routing = tuple[RoutedExperts | None, str | None]
"""A call's routing, or why it has none."""


def _rows_wanted(prompt_len: int, output_len: int, start: int) -> int:
    return prompt_len + output_len - 1 - start


def vllm_routing(encoded: str | None, prompt_len: int, output_len: int, start: int) -> Routing:
    """vLLM's `routed_experts` of a call whose routing was asked from prompt token `start`."""
    if encoded is None:
        return None, (
            "the engine returned no routed_experts (start vLLM >= 0.32 with "
            "--enable-return-routed-experts)"
        )
    try:
        array = np.load(io.BytesIO(base64.b64decode(encoded, validate=True)), allow_pickle=False)
    except (ValueError, binascii.Error, OSError, EOFError) as exc:
        return None, f"routed_experts is not base64 of an .npy array: {exc}"
    return _checked(array, prompt_len, output_len, start)


def sglang_routing(
    encoded: str | None, prompt_len: int, output_len: int, start: int, shape: tuple[int, int]
) -> Routing:
    """SGLang's `meta_info.routed_experts` (raw int32, whole sequence) of a call of a
    model of `shape` (MoE layers, top_k), kept from prompt token `start` on."""
    layers, top_k = shape
    if encoded is None:
        return None, (
            "the engine returned no meta_info.routed_experts (start SGLang with "
            "--enable-return-routed-experts)"
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error) as exc:
        return None, f"routed_experts is not base64: {exc}"
    width = layers * top_k * 4
    if len(raw) % width:
        return None, f"routed_experts holds {len(raw)} bytes, not rows of {layers} x {top_k} int32"
    array = np.frombuffer(raw, dtype="<i4").reshape(-1, layers, top_k)
    return _checked(array, prompt_len, output_len, 0, keep_from=start)


def _checked(
    array: np.ndarray, prompt_len: int, output_len: int, start: int, keep_from: int | None = None
) -> Routing:
    """`array` (rows from `start` on) as the call's routing, kept from `keep_from` on
    (default: all of it)."""
    keep_from = start if keep_from is None else keep_from
    want = _rows_wanted(prompt_len, output_len, start)
    if array.ndim != 3 or array.shape[0] != want:
        return None, (
            f"routed_experts has shape {tuple(array.shape)}; the call needs {want} rows "
            f"(prompt from {start} and output but the last) of (layers, top_k)"
        )
    try:
        return RoutedExperts.of(array[keep_from - start :], start=keep_from), None
    except ValueError as exc:
        return None, f"routed_experts: {exc}"
