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
    "local": ("sandboxes.backends.local", "LocalBackend"),
    "docker": ("sandboxes.backends.docker", "DockerBackend"),
    "e2b": ("sandboxes.backends.e2b", "E2BBackend"),
}
_FACTORIES: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make a backend constructible by name (adding a backend touches no harness).

    Register the class itself, so callers can read its capabilities (`backend_class`)."""
    _FACTORIES[name] = factory


def _factory(name: str) -> BackendFactory | None:
    if name not in _FACTORIES and name in BUILTIN_BACKENDS:
        module, cls = BUILTIN_BACKENDS[name]
        register_backend(name, getattr(importlib.import_module(module), cls))
    return _FACTORIES.get(name)


def get_backend(name: str, **config: Any) -> SandboxBackend:
    """Construct a backend by name: "local", "docker", "e2b" or a registered one."""
    factory = _factory(name)
    if factory is None:
        known = sorted({*_FACTORIES, *BUILTIN_BACKENDS})
        raise KeyError(f"unknown sandbox backend {name!r}; known: {known}")
    return factory(**config)


def backend_class(name: str) -> type[SandboxBackend]:
    """The class of a backend by name, not constructed: what callers ask for its
    capabilities (`SandboxBackend.host_local`, ...). A name nobody registered, or one
    registered as a plain function, gets `SandboxBackend`'s defaults (a remote backend):
    asking never fails where constructing would."""
    factory = _factory(name)
    if isinstance(factory, type) and issubclass(factory, SandboxBackend):
        return factory
    return SandboxBackend
