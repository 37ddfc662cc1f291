"""Sandbox backends (local bubblewrap, docker, e2b) behind one protocol.

Imports only `schemas` among this project's packages (never `gateway`, `harnesses`,
`hooks`, `activities` or `workflows`). Harnesses and hooks import only `base` and use
only a `Sandbox` (exec, files, env, handle); see docs/sandboxes.md.

Modules:
  base               the protocol (Sandbox, SandboxBackend) and its models
  registry           backends by name (get_backend, register_backend)
  local, docker, e2b one module per backend; they import only the shared modules below
  supervised         base of the local and docker backends: warm pool, create, attach,
                     destroy, reap; the sandbox driven by the in-sandbox supervisor
  supervisor         the in-sandbox supervisor itself (stdlib only, runs inside)
  supervisor_client  the host's client of that supervisor
  provisioning       files, repo, setup and environment from a SandboxSpec
  host_state         per-sandbox state on the host: state dirs, owners, reap rule
  cgroups            cgroup limits, kills and OOM counts
  gateway_channel    host side of the Gateway channel (Unix socket bridge)
  pool               warm pool of blank sandboxes
  reaper             reaping across backends
  images, image/     the base-image recipe
"""
