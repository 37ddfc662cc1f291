"""The call pipeline: one agent call from canonical request to recorded reply
(`pipeline.Gateway`: the session service extended with the calls, `_sample` in named
steps), and the relay between a streamed call's engine stream and its response.

It must not import the HTTP app (`http` imports it).
"""
