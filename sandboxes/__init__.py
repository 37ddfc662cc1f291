"""Sandbox backends (local bubblewrap, docker, e2b) behind one protocol.

Must not import `harnesses`, `gateway` internals or `workflows`.

Owns: the protocol and boundary models (`base`: SandboxSpec, SandboxHandle,
ExecResult, Sandbox, SandboxBackend, get_backend), the backends (`local`, `docker`,
`e2b`), the in-sandbox supervisor shipped into local/docker sandboxes
(`supervisor.py`, stdlib only), the host side of the Gateway channel
(`gateway_channel`), warm pools (`pool`), the cross-backend janitor (`janitor`) and
the base-image recipe (`images`, `image/Dockerfile`). Harnesses use only `Sandbox`
(exec, files, env, handle); see docs/sandboxes.md.
"""
