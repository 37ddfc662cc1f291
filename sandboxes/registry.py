"""Sandbox backends by name: the built-in "local", "docker" and "e2b", and any registered.

Why by name: task specs and worker config name their backend as a string
(``backend="docker"`` plus keyword config), and adding a backend must touch none of
the code that reads them. Built-in backends are imported on first use, so asking for
one never imports another's SDK (docker, e2b).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from sandboxes.base import SandboxBackend

BackendFactory = Callable[..., SandboxBackend]

#: Built-in backends: name -> (module, class), imported when first asked for.
BUILTIN_BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("sandboxes.local", "LocalBackend"),
    "docker": ("sandboxes.docker", "DockerBackend"),
    "e2b": ("sandboxes.e2b", "E2BBackend"),
}
_FACTORIES: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make a backend constructible by name (adding a backend touches no harness)."""
    _FACTORIES[name] = factory


def get_backend(name: str, **config: Any) -> SandboxBackend:
    """Construct a backend by name: "local", "docker", "e2b" or a registered one."""
    if name not in _FACTORIES and name in BUILTIN_BACKENDS:
        module, cls = BUILTIN_BACKENDS[name]
        register_backend(name, getattr(importlib.import_module(module), cls))
    if name not in _FACTORIES:
        known = sorted({*_FACTORIES, *BUILTIN_BACKENDS})
        raise KeyError(f"unknown sandbox backend {name!r}; known: {known}")
    return _FACTORIES[name](**config)
