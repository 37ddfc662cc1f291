"""Scene classification: data-driven rules over path, headers, model, max_tokens, tools and
content markers. Session rules are tried first, then the named profile's, then the default."""

import itertools
import re

from gateway.canonical import CanonicalRequest
from schemas.scenes import Scene, SceneConfig, SceneRule

BASE_RULES: list[SceneRule] = [
    # Markers the protocol adapters derive from each client's own signals.
    SceneRule(scene=Scene.compaction, header_equals={"x-rollout-request-kind": "compaction"}),
    SceneRule(scene=Scene.compaction, path_suffix="/responses/compact"),
    SceneRule(scene=Scene.subagent, header_present="x-rollout-subagent"),
    SceneRule(scene=Scene.probe, max_tokens_at_most=1),
]
"""Tried after the session's own rules (which harnesses fill from their profiles)."""


def _first_text(request: CanonicalRequest, role: str, last: bool = False) -> str:
    """The first (or last) `role` message's text, found from that end of the prompt."""
    messages = reversed(request.messages) if last else request.messages
    found = next((m for m in messages if m.role == role), None)
    return (found.content or "") if found is not None else ""


def rule_matches(rule: SceneRule, request: CanonicalRequest, headers: dict[str, str]) -> bool:
    """Whether every condition `rule` sets holds; `headers`: the request's, names lower
    case. The cheap conditions are tried first."""
    if rule.path_suffix is not None and not request.path.endswith(rule.path_suffix):
        return False
    if rule.header_present is not None and rule.header_present.lower() not in headers:
        return False
    if any(headers.get(k.lower()) != v for k, v in rule.header_equals.items()):
        return False
    if rule.max_tokens_at_most is not None:
        max_tokens = request.sampling.max_tokens
        if max_tokens is None or max_tokens > rule.max_tokens_at_most:
            return False
    if rule.no_tools is not None and rule.no_tools != (not request.tools):
        return False
    if rule.model_regex is not None and re.search(rule.model_regex, request.model) is None:
        return False
    if rule.system_contains is not None and rule.system_contains not in _first_text(
        request, "system"
    ):
        return False
    return rule.last_user_contains is None or rule.last_user_contains in _first_text(
        request, "user", last=True
    )


def classify(request: CanonicalRequest, config: SceneConfig) -> Scene:
    headers = {k.lower(): v for k, v in request.headers.items()}
    for rule in itertools.chain(config.rules, BASE_RULES):
        if rule_matches(rule, request, headers):
            return rule.scene
    return Scene.main
