"""Sandbox backends (local bubblewrap, docker, e2b) behind one protocol.

Must not import `harnesses`, `gateway` internals or `workflows`.
"""
