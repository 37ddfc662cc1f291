"""Sandbox backends (local bubblewrap, docker, e2b) behind one protocol.

Imports only `schemas` among this project's packages (never `gateway`, `harnesses`,
`hooks`, `activities` or `workflows`). Harnesses and hooks import only `base` and use
only a `Sandbox` (exec, files, env, handle); see docs/sandboxes.md.

Rooms, each importing only those below it (an import contract):
  reaper       reaping across backends
  backends/    one module per backend (local, docker, e2b); never one another
  supervision/ the base of the local and docker backends and the in-sandbox supervisor
  workspace/, network/, isolation/, image/
               files/repo/setup, Gateway channel and egress, cgroups/disk/seccomp,
               base and task images
  host/        per-sandbox state on the host, host commands that die with the worker
  registry     backends by name and their capabilities (get_backend, backend_class)
  base         the contract (Sandbox, SandboxBackend) and its models
"""
