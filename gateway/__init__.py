"""The LLM Gateway: records every agent LLM call token-exact, in front of the engines.

One sub-package (room) per job, each importing only the rooms below it (an import
contract; `docs/layout.md` has the table): `http` (the two listeners), `calls` (the call
pipeline), `sessions` (session service, lifetimes, reaper, scenes), `capture` (the store,
recorded calls, trajectories, revival, retries), `observability` (metrics, spans),
`engines` (the Engine protocol, vLLM, routing, policy updates), `parsers` (output
parsing per model family), `protocols` (one folder per wire protocol, a registry) and
`prompt` (templates, tokenizers, incremental tokenization). The top-level modules are the
shared base every room may use: `canonical`, `errors`, `json_text`, `options`, and
`control_client` (the control API's client for other packages).

It knows nothing of Temporal, sandboxes or harnesses: it must not import `workflows`,
`activities`, `sandboxes`, `harnesses` or `hooks`.
"""
