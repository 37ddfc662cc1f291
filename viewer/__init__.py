"""The rollout viewer: server-rendered pages over a samples directory (`rollout view`)."""
