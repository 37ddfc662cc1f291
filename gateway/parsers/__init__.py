"""Output parsers: sampled text split into reasoning, content and tool calls, per model
family, whole or while the tokens arrive. `base` is the interface, `registry` the
families by name, one module per family (`hermes`), and `stream` feeds a call's ids to
its family's splitter.

Pure logic: no I/O, and no import of the HTTP app, calls, sessions, capture, engines or
protocols; nothing outside `registry` names a family.
"""
