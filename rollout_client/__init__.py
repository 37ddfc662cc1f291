"""The trainer-facing SDK: everything a trainer process needs to drive rollouts.

The surface (import it from here):

- `connect(address, …)` → a Temporal `Client` with the system's converter (pydantic
  JSON, payloads encrypted with `ROLLOUT_PAYLOAD_KEY`) and TLS settings;
  `RolloutClient.connect(…)` wraps one.
- `RolloutClient`: `submit` a batch (N samples per task = one GRPO group per task),
  `results` (each `RolloutOutcome` once, in completion order), `counts`, `cancel` a
  batch, `load_samples` of finished rollouts. `Batch` is what `submit` returns.
  `submit_groups` is the training submission: the same, checked first (group size >= 2,
  every task evaluated, a label the Gateway served), refusing with `TrainingInputError`
  (a `ValueError` naming the field); the checks alone are in `rollout_client.training`.
- `TemporalTLS`, `TemporalConnectError`: TLS / mTLS / API key towards the Temporal
  frontend, read from the `TEMPORAL_TLS_*` / `TEMPORAL_API_KEY` environment like the
  `temporal` CLI.
- `load_keys`, `new_key`, `parse_key`, `PayloadKeyError`: the payload encryption keys.
- `read_table`, `read_many`, `read_samples`, `write_table`, `write_samples`: sample
  tables in a local directory or `s3://bucket/prefix`, schema-version checked.
- `SamplesReader` (`rollout_client.samples_reader`): a samples directory read for
  people, as `rollout show` and the viewer show it: a batch's rollouts (status, whose
  failure, reason, reward, checks, step durations, calls, tokens) and one rollout in
  full, with its artifacts looked up in a worker's data dir.
- `load_task_source`, `LoadOptions`, `LoadedTasks`, `RefusedTask`: read a dataset (our
  JSONL, a Harbor task directory or a directory of them, SWE-bench instances) into
  `RolloutTask`s to submit; refused tasks come back named, with the field at fault
  (from `task_formats`).
- `GatewayPolicyClient`, `PolicyUpdateError`, `ExternalUpdate`: publish a checkpoint as
  the new policy version through the Gateway's control API (`POST /policy`), or hold the
  Gateway around a weight sync the trainer does itself (`external_update`).

The request, result and sample models (`RolloutTask`, `RolloutResult`, `SampleRow`,
`PolicyUpdate`, …) stay in `schemas`, the pure contracts.

Why a package of its own: `schemas` is pure data (no network, storage, crypto or
Temporal) so every part may import it; this package holds the I/O a trainer needs and
runs in the trainer's own environment (temporalio, pyarrow, boto3, httpx, cryptography;
no server frameworks). Of our packages it imports only `schemas` and `task_formats`
(pure reading of datasets): never gateway,
workers, activities, workflows, sandboxes, harnesses, hooks, devstack or trainer
(import contracts say so). The workers and the collect activity use its codec, connection and
storage modules too, so both sides agree on the wire and the file layout.
"""

from rollout_client.client import Batch, RolloutClient, RolloutOutcome, connect
from rollout_client.codec import PayloadKeyError, load_keys, new_key, parse_key
from rollout_client.policy import ExternalUpdate, GatewayPolicyClient, PolicyUpdateError
from rollout_client.samples_reader import SamplesReader
from rollout_client.storage import read_many, read_samples, read_table, write_samples, write_table
from rollout_client.temporal_connection import TemporalConnectError, TemporalTLS
from rollout_client.training import TrainingInputError
from task_formats import LoadedTasks, LoadOptions, RefusedTask, load_task_source

__all__ = [
    "Batch",
    "ExternalUpdate",
    "GatewayPolicyClient",
    "LoadOptions",
    "LoadedTasks",
    "PayloadKeyError",
    "PolicyUpdateError",
    "RefusedTask",
    "RolloutClient",
    "RolloutOutcome",
    "SamplesReader",
    "TemporalConnectError",
    "TemporalTLS",
    "TrainingInputError",
    "connect",
    "load_keys",
    "load_task_source",
    "new_key",
    "parse_key",
    "read_many",
    "read_samples",
    "read_table",
    "write_samples",
    "write_table",
]
