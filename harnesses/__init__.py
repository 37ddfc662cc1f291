"""Agent harnesses: one module per agent CLI (setup, run, cleanup).

A harness only needs a sandbox handle, a base URL and a token; it must not import
`gateway` internals, `workflows` or a concrete sandbox backend.

`base` holds the protocol (`AgentHarness`, `HarnessContext`, `GatewayEndpoints`) and the
shared CLI runner, which returns a `schemas.outcome.AgentResult`;
`registry.get_harness(name, config)` builds one by name; each agent module also ships its scene profile as data (`harness.scene_config()`), and
`versions` pins the agent releases the harnesses were written against.
"""
