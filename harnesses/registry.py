"""Harness lookup by name (tasks name their agent; adding one touches no backend)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from harnesses.base import AgentHarness

_BUILTIN: dict[str, tuple[str, str]] = {
    "claude_code": ("harnesses.claude_code", "ClaudeCodeHarness"),
    "codex": ("harnesses.codex", "CodexHarness"),
    "hermes": ("harnesses.hermes", "HermesHarness"),
    "mini_swe_agent": ("harnesses.mini_swe_agent", "MiniSweAgentHarness"),
    "command": ("harnesses.command", "CommandHarness"),
    "oracle": ("harnesses.oracle", "OracleHarness"),
}
_REGISTERED: dict[str, type[AgentHarness]] = {}


def register_harness(cls: type[AgentHarness]) -> type[AgentHarness]:
    """Make a harness class constructible by its `name` (usable as a decorator)."""
    _REGISTERED[cls.name] = cls
    return cls


def harness_class(name: str) -> type[AgentHarness]:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module, attr = _BUILTIN[name]
        cls: type[AgentHarness] = getattr(importlib.import_module(module), attr)
        return cls
    raise KeyError(f"unknown harness {name!r}; known: {sorted({*_BUILTIN, *_REGISTERED})}")


def get_harness(name: str, config: Mapping[str, Any] | None = None) -> AgentHarness:
    """A fresh harness instance (one per rollout: it holds per-run state)."""
    return harness_class(name)(dict(config or {}))


def harness_names() -> list[str]:
    return sorted({*_BUILTIN, *_REGISTERED})
