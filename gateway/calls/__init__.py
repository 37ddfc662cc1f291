"""The call pipeline: one agent call from canonical request to recorded reply, and the
relay between a streamed call's engine stream and its response.

It must not import the HTTP app.
"""
