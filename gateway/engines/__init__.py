"""Engines: the clients that sample token ids (vLLM), their reply validation, and
policy updates (pause, drain, load weights, resume).

It must not import the HTTP app, sessions, calls or capture.
"""
