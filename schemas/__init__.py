"""Pydantic models, the Arrow/Parquet schema and pure functions over them: the contracts
with trainers and between parts (the agent versions the harnesses and the sandbox image
share among them: `agent_versions`).

Pure data: must not import any other project package, nor do I/O — no network, storage,
crypto or Temporal (import contracts say so). The I/O that goes with these contracts
(the trainer's client, payload codec, Temporal connection, sample storage) lives in
`rollout_client`.
"""
