"""Protocol adapters: each translates one client protocol into `CanonicalRequest` and a
`Reply` back into that protocol's reply, stream and error shapes.

Per protocol, `<protocol>.py` holds the request models and their conversion and
`<protocol>_reply.py` the replies; `wire.py`, `sse.py` and `opaque_token.py` hold what the
protocols share.
"""
