"""Sandboxes run by an in-sandbox supervisor: what the host-local backends share.

`supervised` is their base (`SupervisedBackend`, `SupervisedSandbox`: warm pool, create,
attach, destroy, reap); `supervisor` is the stdlib-only process copied into every such
sandbox, `supervisor_client` the host's client of it, `pool` the warm pool of blanks.
"""
