"""The sandbox backends, one module each: `local` (bubblewrap), `docker`, `e2b`.

A backend is a `SandboxBackend` subclass (`sandboxes/base.py`) that declares its
capabilities as class attributes and is named in `sandboxes/registry.py`. Backends
import the contract and the shared rooms (`supervision`, `isolation`, `network`,
`workspace`, `image`, `host`), never one another; nothing below them imports a backend.
"""
