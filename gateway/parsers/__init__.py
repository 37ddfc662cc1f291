"""Output parsers: sampled text split into reasoning, content and tool calls, per model
family, whole or while the tokens arrive.

Pure logic: no I/O, and no import of the HTTP app, sessions, calls, engines or capture.
"""
