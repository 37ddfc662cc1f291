"""The LLM Gateway: HTTP app, protocol adapters, tokenization, trajectory store, engine client.

It records every agent LLM call token-exact. It knows nothing of Temporal, sandboxes or
harnesses: it must not import `workflows`, `activities`, `sandboxes`, `harnesses` or `hooks`.
"""
