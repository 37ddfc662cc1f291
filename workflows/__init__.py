"""The rollout workflow (`RolloutWorkflow`) and batch helpers.

Owns deterministic orchestration only. Must not import `gateway`, `sandboxes`,
`harnesses` or `hooks`, and must not do I/O: everything with side effects is an activity.

`workflows.rollout.RolloutWorkflow` (registered as "RolloutWorkflow") runs one rollout;
it refers to activities by name and exchanges only the small models of
`schemas.rollout`. GRPO groups are built by the trainer client (`rollout_client.client`):
N rollouts of one task share a `group_id`, each its own workflow (id = rollout id).
"""
