"""HTTP serving: the two listeners (agent API, control API), streamed responses and
forwarding a call to the process that owns its session.

The top room: it may import every other room, and no room imports it.
"""
