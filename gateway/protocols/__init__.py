"""Wire protocols: each translates one client protocol into `CanonicalRequest` and a
`Reply` back into that protocol's reply, stream and error shapes.

One folder per protocol (`request.py`, `reply.py`, and its `__init__.py` declaring a
`base.WireProtocol`: routes, error shape, span label), listed in `registry.PROTOCOLS`;
`wire`, `sse`, `history` and `opaque_token` hold what the protocols share.

It must not import the HTTP app, calls, sessions, capture, engines or parsers.
"""
