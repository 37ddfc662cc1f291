"""Scene classification: data-driven rules over path, headers, model, max_tokens, tools and
content markers. Session rules are tried first, then the named profile's, then the default."""

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
    messages = [m for m in request.messages if m.role == role]
    if not messages:
        return ""
    return (messages[-1] if last else messages[0]).content or ""


def rule_matches(rule: SceneRule, request: CanonicalRequest) -> bool:
    headers = {k.lower(): v for k, v in request.headers.items()}
    checks = [
        rule.path_suffix is None or request.path.endswith(rule.path_suffix),
        rule.header_present is None or rule.header_present.lower() in headers,
        all(headers.get(k.lower()) == v for k, v in rule.header_equals.items()),
        rule.model_regex is None or re.search(rule.model_regex, request.model) is not None,
        rule.max_tokens_at_most is None
        or (
            request.sampling.max_tokens is not None
            and request.sampling.max_tokens <= rule.max_tokens_at_most
        ),
        rule.system_contains is None or rule.system_contains in _first_text(request, "system"),
        rule.last_user_contains is None
        or rule.last_user_contains in _first_text(request, "user", last=True),
        rule.no_tools is None or rule.no_tools == (not request.tools),
    ]
    return all(checks)


def classify(request: CanonicalRequest, config: SceneConfig) -> Scene:
    for rule in [*config.rules, *BASE_RULES]:
        if rule_matches(rule, request):
            return rule.scene
    return Scene.main
