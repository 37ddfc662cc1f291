"""HTTP serving: the two listeners (agent API, control API), streamed responses and
forwarding a call to the process that owns its session.

The only room that knows Starlette routing and the listeners; no other room imports it.
"""
