"""Routed experts in the call pipeline: from where a call asks for them, what of the
engine's answer is recorded, and where the session's next call asks from.

A call asks from its segment's previous call's prompt end on (0 for a segment's first
call, or after a call without routing): the prompt the previous call already returned is
not asked again, its sampled tokens are, so a re-read can be compared with the sampling
call's routing (`capture.routing_splice`). Routing of another shape than the model's
(the gateway's `--routed-experts-layers/-top-k`, else the session's first recorded one)
is not recorded: the call is, with the reason.
"""

from gateway.engines.base import EngineCompletion
from gateway.options import GatewayOptions
from gateway.prompt.incremental import PromptPlan
from gateway.sessions.live import LiveSession
from schemas.routing import RoutedExperts
from schemas.trajectory import MatchKind


def routing_from(session: LiveSession, plan: PromptPlan) -> int:
    """The first prompt token whose routing the call asks for."""
    if plan.kind is MatchKind.fork or plan.segment is None:
        return 0
    return min(session.routing_from.get(plan.segment_id, 0), plan.base_length)


def recorded_routing(
    session: LiveSession, options: GatewayOptions, completion: EngineCompletion
) -> tuple[RoutedExperts | None, str | None]:
    """The call's routing as recorded, or why it has none."""
    experts = completion.routed_experts
    if experts is None:
        return None, completion.routing_missing or "the engine returned no routed experts"
    layers, top_k = options.routed_experts_layers, options.routed_experts_top_k
    model = (layers, top_k) if layers is not None and top_k is not None else None
    shape = model or session.routing_shape
    got = (experts.layers, experts.top_k)
    if shape is not None and got != shape:
        return None, (
            f"routed_experts of {got[0]} layers x {got[1]} experts; the model's are "
            f"{shape[0]} x {shape[1]}"
        )
    session.routing_shape = got
    return experts, None


def remember(
    session: LiveSession, plan: PromptPlan, segment_id: str, experts: RoutedExperts | None
) -> None:
    """After a call is recorded: where its segment's next call asks from."""
    if experts is not None and segment_id == plan.segment_id:
        session.routing_from[segment_id] = len(plan.prompt_ids)
    else:
        session.routing_from.pop(plan.segment_id, None)
        session.routing_from.pop(segment_id, None)
