"""What the host keeps for its sandboxes: per-sandbox state, owners and the reap rule
(`state`), and host commands that die with the worker waiting for them (`commands`)."""
