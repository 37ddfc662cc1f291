"""Serializers for agent config files (TOML for Codex, YAML for Hermes/mini).

Why hand-rolled: the project has no TOML writer dependency and the configs are tiny
(strings, numbers, booleans, lists and nested tables). YAML is written as JSON, which
is valid YAML 1.2 and parsed by every YAML loader, so no YAML dependency is needed
either. Tests parse the output with `tomllib` / `yaml.safe_load` to prove validity.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        # JSON string escapes (\\, \", \n, \uXXXX) are valid TOML basic-string escapes.
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        inner = ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def toml_dumps(data: Mapping[str, Any], _prefix: str = "") -> str:
    """TOML text for nested mappings: scalars first, then `[table]` sections."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping) and v:
            tables.append((k, v))
        else:
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in tables:
        name = f"{_prefix}.{_key(k)}" if _prefix else _key(k)
        lines.append("")
        lines.append(f"[{name}]")
        body = toml_dumps(v, name)
        if body:
            lines.append(body)
    return "\n".join(lines).strip("\n") + ("\n" if not _prefix else "")


def yaml_dumps(data: Mapping[str, Any]) -> str:
    """YAML text (JSON flavour) for a mapping."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
