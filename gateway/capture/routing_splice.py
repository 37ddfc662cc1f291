"""A segment's routed experts, spliced from its calls' like its token ids.

Each call returns the routing of its prompt from some position on (`start`) and of its
sampled tokens but the last. A token sampled in one call is read again as context by the
next, which may return its routing a second time (the Gateway asks the engine from the
previous call's prompt end on, so it does for every sampled token of the previous call).
The token keeps its first routing, the one of the call that sampled it: that is what the
tokens sampled after it in that call were conditioned on, and what a trainer replays to
reproduce their logprobs. A re-read only fills what no call returned before (the last
sampled token of each call, the tokens the next request added). How often a re-read
routes a token otherwise is counted (`rereads`, `reread_differs`) so it can be measured.
A segment has routing only when every token but its last has some; otherwise it says why.
"""

import numpy as np

from schemas.routing import RoutedExperts
from schemas.trajectory import RecordedCall


class RoutingSplice:
    """Folds the routing of a segment's calls, in order, into the segment's."""

    def __init__(self) -> None:
        self.parts: list[tuple[int, np.ndarray]] = []
        """(first token, rows) of each call's newly covered tokens, in token order."""
        self.covered = 0
        """Tokens 0 .. covered-1 have routing."""
        self.shape: tuple[int, int] | None = None
        self.missing: str | None = None
        self.asked = False
        self.rereads = 0
        self.reread_differs = 0

    def add(self, call: RecordedCall) -> None:
        """One ok call of the segment, after the previous ones."""
        routing = call.routed_experts
        if routing is None:
            if call.routing_missing is not None:
                self.asked = True
                self._lacks(call, call.routing_missing)
            return
        self.asked = True
        if self.shape is not None and (routing.layers, routing.top_k) != self.shape:
            layers, top_k = self.shape
            self._lacks(
                call,
                f"routing of {routing.layers} layers x {routing.top_k} experts, the "
                f"segment's earlier calls' {layers} x {top_k}",
            )
            return
        if routing.start > self.covered:
            self._lacks(call, f"routing starts at token {routing.start}, after a gap")
            return
        self.shape = (routing.layers, routing.top_k)
        rows = routing.array()
        again = min(self.covered - routing.start, routing.tokens)
        if again > 0:
            kept = self._rows(routing.start, routing.start + again)
            self.rereads += again
            self.reread_differs += int(np.any(kept != rows[:again], axis=(1, 2)).sum())
        if routing.tokens > again:
            self.parts.append((self.covered, rows[again:]))
            self.covered = routing.start + routing.tokens

    def _lacks(self, call: RecordedCall, why: str) -> None:
        if self.missing is None:
            self.missing = f"call {call.call_id}: {why}"

    def _rows(self, begin: int, end: int) -> np.ndarray:
        """The kept rows of tokens begin .. end-1 (all covered)."""
        pieces = []
        for first, rows in self.parts:
            last = first + rows.shape[0]
            if last > begin and first < end:
                pieces.append(rows[max(begin - first, 0) : min(end, last) - first])
        return np.concatenate(pieces)

    def result(self, length: int) -> tuple[RoutedExperts | None, str | None]:
        """The segment's routing over its `length` tokens, or why it has none (None, None:
        no call of it asked). A gap a later call's routing filled is no loss."""
        if not self.asked:
            return None, None
        if not self.parts or self.covered < length - 1:
            return None, self.missing or f"tokens from {self.covered} on have no routing"
        rows = np.concatenate([rows for _, rows in self.parts])[: length - 1]
        return RoutedExperts.of(rows), None
