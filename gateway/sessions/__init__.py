"""Sessions: the session service of a process (`service`: create, authenticate, revive,
expire, close; `live`: a session in memory), their lifetimes, the session reaper that
closes expired ones, and scene classification.

It must not import the HTTP app or the call pipeline (`calls` builds on it).
"""
