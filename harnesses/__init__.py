"""Agent harnesses: one module per agent CLI (setup, run, cleanup).

A harness only needs a sandbox, the task and its Gateway endpoints (a base URL and a
token). It imports only `schemas` and the sandbox protocol (`sandboxes.base`): never
`gateway`, `workflows`, `hooks` or a concrete sandbox backend (checked by the import
contract).

`base` holds the protocol (`AgentHarness`, `HarnessContext`, `GatewayEndpoints`) and the
shared CLI runner, which returns a `schemas.outcome.AgentResult`;
`registry.get_harness(name, config)` builds one by name; each agent module also ships
its scene profile as data (`harness.scene_config()`), and `versions` pins the agent
releases the harnesses were written against.
"""
