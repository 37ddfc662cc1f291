"""Routed experts (MoE routing replay): which experts each token was routed to, per layer.

An engine that runs a Mixture-of-Experts model chooses `top_k` experts per token in each
MoE layer; a trainer that replays those choices trains the policy the rollout sampled
from. A `RoutedExperts` holds them for a run of consecutive tokens as one C-order array
of shape (tokens, layers, top_k) in the narrowest unsigned dtype that holds its largest
expert id: one byte per choice for up to 256 experts, against ~3 bytes per choice as a
JSON list. Row `i` is the routing of token `start + i` of the sequence it belongs to (a
call's prompt followed by its output, or a segment's prompt followed by its response).
The last token of a sequence has none: it was sampled, never read back.
"""

from typing import Literal, Self

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from schemas.base import StrictModel

RoutingDtype = Literal["uint8", "uint16", "uint32"]
_DTYPES: tuple[RoutingDtype, ...] = ("uint8", "uint16", "uint32")


def narrowest_dtype(max_id: int) -> RoutingDtype:
    """The narrowest unsigned dtype holding expert ids up to `max_id`."""
    for name in _DTYPES:
        if max_id <= np.iinfo(name).max:
            return name
    raise ValueError(f"expert id {max_id} does not fit in uint32")


class RoutedExperts(StrictModel):
    """Expert ids per token and MoE layer (`data`: little-endian, C order, shape
    `(tokens, layers, top_k)` of `dtype`; base64 in JSON)."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    start: int = Field(ge=0, description="the sequence position of the first row's token")
    tokens: int = Field(ge=0)
    layers: int = Field(ge=1)
    top_k: int = Field(ge=1)
    dtype: RoutingDtype
    data: bytes

    @model_validator(mode="after")
    def _sized(self) -> Self:
        want = self.tokens * self.layers * self.top_k * np.dtype(self.dtype).itemsize
        if len(self.data) != want:
            raise ValueError(
                f"routed experts data is {len(self.data)} bytes; shape "
                f"({self.tokens}, {self.layers}, {self.top_k}) of {self.dtype} needs {want}"
            )
        return self

    @classmethod
    def of(cls, array: np.ndarray, start: int = 0) -> Self:
        """A (tokens, layers, top_k) array of non-negative integer ids, stored narrowest."""
        if array.ndim != 3 or array.shape[1] < 1 or array.shape[2] < 1:
            raise ValueError(f"routed experts must be (tokens, layers, top_k), got {array.shape}")
        if array.dtype.kind not in "iu":
            raise ValueError(f"routed experts must be integer ids, got {array.dtype}")
        if array.size and int(array.min()) < 0:
            raise ValueError("routed experts hold a negative expert id")
        dtype = narrowest_dtype(int(array.max()) if array.size else 0)
        data = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        tokens, layers, top_k = array.shape
        return cls(start=start, tokens=tokens, layers=layers, top_k=top_k, dtype=dtype, data=data)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.tokens, self.layers, self.top_k)

    def array(self) -> np.ndarray:
        """The ids as a read-only (tokens, layers, top_k) array of `dtype`."""
        flat = np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        return flat.reshape(self.shape)
