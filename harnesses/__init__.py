"""Agent harnesses: one module per agent CLI (setup, run, cleanup).

A harness only needs a sandbox handle, a base URL and a token; it must not import
`gateway` internals, `workflows` or a concrete sandbox backend.
"""
