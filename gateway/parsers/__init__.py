"""Output parsers: sampled text split into reasoning, content and tool calls, per model
family, whole or while the tokens arrive. `base` is the interface, `tagged` the shape
most families share, `json_calls` and `typed_arguments` what their argument formats
share, one module per family (`hermes`, `qwen3_coder`, `glm`, `minimax`, `harmony`,
`kimi_k2`, `deepseek`, `llama`, `mistral`), each declaring its families (`family`),
`registry` the list of them, `selection` which family a model is, and `stream` feeds a
call's ids to its family's splitter.

Pure logic: no I/O, and no import of the HTTP app, calls, sessions, capture, engines or
protocols; nothing outside a family's own module names it.
"""
