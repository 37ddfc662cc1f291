"""The reference GRPO trainer (`rollout train` runs it): a plain client of the service.

It runs in the trainer environment (the vLLM venv's torch and transformers plus a small
overlay, see `environments.trainer`), never in the gateway's or workers' processes, and
imports only `schemas` and `rollout_client` (an import contract). Modules: `batch`
(staleness, masking, advantages; pure Python), `loss` (log-probs, clipped loss,
agreement), `policy` (checkpoints), `report` (metrics and curve), `loop` (the steps),
`__main__` (entry).
"""
