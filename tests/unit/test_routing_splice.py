"""A segment's routed experts spliced from its calls' (`gateway.capture.routing_splice`):
hand-made calls of a segment whose tokens are 0..9 (call 1: prompt 0..3, output 4..5;
call 2: prompt 0..7, output 8..9), routing ids = token * 10 + layer (+ 100 when re-read
by a later call, so a re-read that differs shows)."""

import numpy as np

from gateway.capture.routing_splice import RoutingSplice
from schemas.routing import RoutedExperts
from schemas.trajectory import RecordedCall
from tests.unit.test_workflow_samples import call

LAYERS, TOP_K = 2, 1


def routed(first: int, last: int, *, reread_from: int | None = None) -> RoutedExperts:
    """Routing of tokens first..last-1 (those from `reread_from` on were routed before)."""
    tokens = np.arange(first, last)
    ids = tokens[:, None, None] * 10 + np.arange(LAYERS)[None, :, None]
    if reread_from is not None:
        ids = ids + 100 * (tokens < reread_from)[:, None, None]
    return RoutedExperts.of(np.broadcast_to(ids, (last - first, LAYERS, TOP_K)), start=first)


def calls(
    first: RoutedExperts | None, second: RoutedExperts | None, missing: str | None = "none"
) -> list[RecordedCall]:
    """The segment's two calls; call 1 without routing says `missing`."""
    one = call("c1", "s").model_copy(
        update={"prompt_ids": [0, 1, 2, 3], "output_ids": [4, 5], "output_logprobs": [0, 0]}
    )
    two = call("c2", "s").model_copy(
        update={"prompt_ids": list(range(8)), "output_ids": [8, 9], "output_logprobs": [0, 0]}
    )
    return [
        one.model_copy(
            update={"routed_experts": first, "routing_missing": None if first else missing}
        ),
        two.model_copy(update={"routed_experts": second}),
    ]


def spliced(*recorded: RecordedCall) -> RoutingSplice:
    splice = RoutingSplice()
    for c in recorded:
        splice.add(c)
    return splice


def test_a_token_keeps_the_routing_of_the_call_that_sampled_it() -> None:
    """Call 2 asks from 4 (call 1's prompt end): token 4 is re-read (routed otherwise),
    5 (call 1's last, never read back) and 6, 7 (new) are filled by call 2."""
    splice = spliced(*calls(routed(0, 5), routed(4, 9, reread_from=5)))
    experts, missing = splice.result(10)
    assert missing is None and experts is not None and experts.tokens == 9
    want = np.arange(9)[:, None] * 10 + np.arange(LAYERS)[None, :]
    np.testing.assert_array_equal(experts.array()[..., 0], want)
    assert (splice.rereads, splice.reread_differs) == (1, 1)


def test_a_call_without_routing_leaves_a_gap_a_later_call_from_the_start_fills() -> None:
    gap = spliced(*calls(None, routed(4, 9), missing="the engine returned none"))
    assert gap.result(10) == (None, "call c1: the engine returned none")
    healed = spliced(*calls(None, routed(0, 9), missing="the engine returned none"))
    experts, missing = healed.result(10)
    assert missing is None and experts is not None and experts.tokens == 9


def test_routing_of_another_shape_than_the_segments_is_not_spliced() -> None:
    wide = RoutedExperts.of(np.zeros((5, LAYERS + 1, TOP_K), dtype=np.int64), start=4)
    splice = spliced(*calls(routed(0, 5), wide))
    experts, missing = splice.result(10)
    assert experts is None
    assert missing == "call c2: routing of 3 layers x 1 experts, the segment's earlier calls' 2 x 1"


def test_a_segment_no_call_asked_routing_of_has_none_and_says_nothing() -> None:
    assert spliced(*calls(None, None, missing=None)).result(10) == (None, None)
