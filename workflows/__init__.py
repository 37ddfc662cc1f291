"""The Controller: RolloutWorkflow and batch helpers.

Owns deterministic orchestration only. Must not import `gateway`, `sandboxes`,
`harnesses` or `hooks`, and must not do I/O: everything with side effects is an activity.
"""
