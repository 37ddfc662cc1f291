"""Temporal activities, one module per rollout step, plus the Runtime Manager composition.

May import `gateway` clients, `sandboxes`, `harnesses`, `hooks` and `schemas`;
must not import `workflows` internals beyond shared pydantic contracts.
"""
