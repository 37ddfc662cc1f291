"""Built-in rollout hooks (logs, evaluate, diff, artifacts, metrics).

Hooks see a sandbox and the agent result; they must not import `workflows` or `gateway`.
"""
