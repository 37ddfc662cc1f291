"""Training-sample rows, their Arrow schema and its checks, and where a rollout's file goes.

This is the contract with trainers. Every row carries full lineage so a sample can be
traced to the policy, environment, template, reward function and harness that made it.
Readers refuse a `schema_version` they do not know rather than guess at its meaning.
Version 2 added the per-call policy versions (a rollout that spans a policy update has
calls of two versions in one segment); version-1 files still read, as one call each.
Version 3 added each call's sampling parameters (`call_sampling`); older files read
with every call given the row's `sampling`.
Version 4 added the task's lineage: `task_source` (where the task came from),
`image_digest` (the sandbox image) and `reward_metrics` (the verifier's other numbers),
and `env_version` became the task's content hash when its source has one (see
`RolloutTask.env_version`). Older files read with `task_source` empty, `image_digest`
equal to their `env_version` (which was the image digest then) and no metrics.
Version 5 added why a reward is what it is: `status_reason` (the evidence behind a
non-ok status, such as what the agent broke), `verdict_sources` (per check, what its
verdict was read from: `reward.txt`, `junit-xml`, a log parser) and `sandbox_facts`
(what provisioning did to the environment, such as trimming the repository's history).
Older files read with all three empty.
Version 6 added what the evaluation said and where the run's pieces are, so a trainer
or viewer needs no worker's disk: `batch_id`, `rollout_status` (the rollout's own
status: its rows of an `eval_error` rollout are `infra_error`), `verdict`, `eval_checks`
(each check's name, kind, pass/fail, score, exit code, timing and the tail of its
detail, capped at `CHECK_DETAIL_CHARS`), `step_durations` (seconds per step of the run)
and `artifacts` (each file the run kept, where the worker put it). Older files read
with them empty (`rollout_status` empty: not recorded).
Version 7 added the conversation as the agent's protocol carried it: `conversation`,
JSON of one entry per call of the segment (aligned with `call_policy_versions`): the
messages new since the previous call, the tools by name and the parsed reply
(`schemas.conversation`). Older files read with it empty (`[]`).
Version 8 added the MoE routing replay: `routed_experts`, the experts each token of
`prompt_ids + response_ids` but the last was routed to in every MoE layer (a struct: its
`tokens`, `layers`, `top_k`, the narrowest unsigned `dtype` and the C-order bytes of the
(tokens, layers, top_k) array; `schemas.routing`), null when the session did not ask for
it or it is not whole, then `routing_missing` says why; and `routing_rereads` /
`routing_reread_differs`, how many tokens a later call routed again and how many of them
otherwise (docs/trainers.md, "Routing replay"). Older files read with no routing.
"""

import json
from functools import cache
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pydantic import Field, model_validator

from schemas.base import StrictModel
from schemas.conversation import conversation_of
from schemas.evaluation import CheckVerdict
from schemas.outcome import SAMPLE_STATUSES, RolloutStatus
from schemas.routing import RoutedExperts
from schemas.scenes import Scene
from schemas.tasks import check_rollout_id

SCHEMA_VERSION = 8
KNOWN_SCHEMA_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8})
#: Columns each version added (a file of an older version lacks them).
_ADDED_IN = {
    2: ("call_policy_versions", "call_starts"),
    3: ("call_sampling",),
    4: ("task_source", "image_digest", "reward_metrics"),
    5: ("status_reason", "verdict_sources", "sandbox_facts"),
    6: (
        "batch_id",
        "rollout_status",
        "verdict",
        "eval_checks",
        "step_durations",
        "artifacts",
        "artifacts_dir",
    ),
    7: ("conversation",),
    8: ("routed_experts", "routing_missing", "routing_rereads", "routing_reread_differs"),
}
#: How much of a check's detail (its output's tail) a sample row keeps.
CHECK_DETAIL_CHARS = 2000


class CheckRow(CheckVerdict):
    """One evaluation check as a sample row carries it: its `detail` is the last
    `CHECK_DETAIL_CHARS` of the check's."""


class ArtifactRow(StrictModel):
    """A file the run kept: its name and kind, and where the worker put it (a URI after
    upload, else a path on the worker's disk)."""

    name: str
    kind: str
    location: str
    size: int = 0


class SampleRow(StrictModel):
    """One training sample: one trainable segment of one rollout."""

    rollout_id: str
    task_id: str
    group_id: str
    sample_index: int = Field(default=0, ge=0)
    segment_id: str
    parent_segment_id: str | None = None
    link: Literal["continues", "spawned_by"] | None = None
    scene: Scene
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    step_rewards: list[float] | None = None
    status: RolloutStatus = Field(description="one of SAMPLE_STATUSES")
    policy_version: str = Field(description="the version of the segment's first call")
    call_policy_versions: list[str] = Field(
        default_factory=list,
        description="the version that sampled each call of the segment (empty: all "
        "`policy_version`)",
    )
    call_starts: list[int] = Field(
        default_factory=list,
        description="where each call's sampled tokens begin in response_ids; the tokens "
        "from one start to the next are that call's",
    )
    env_version: str = Field(
        description="the task's content hash when its source has one, else `image_digest`"
    )
    task_source: str = Field(
        default="", description="'<format>:<ref>' of the task (empty: written before v4)"
    )
    image_digest: str = Field(default="", description="the sandbox's image digest or id")
    prompt_template_version: str
    reward_fn_version: str
    reward_metrics: str = Field(
        default="{}", description="JSON object: the verifier's metrics besides the reward"
    )
    status_reason: str = Field(
        default="", description="why the status is what it is (empty: ok, or written before v5)"
    )
    verdict_sources: str = Field(
        default="{}", description="JSON object: per check, what its verdict was read from"
    )
    sandbox_facts: str = Field(
        default="{}", description="JSON object: what provisioning did to the environment"
    )
    batch_id: str = Field(default="", description="the batch (empty: written before v6)")
    rollout_status: str = Field(
        default="",
        description="the rollout's status, which an `eval_error` rollout's masked rows do "
        "not carry (empty: written before v6)",
    )
    verdict: str = Field(default="", description="pass, fail or error (empty: not evaluated)")
    eval_checks: list[CheckRow] = Field(default_factory=list)
    step_durations: str = Field(
        default="{}", description="JSON object: seconds per step of the run"
    )
    artifacts: list[ArtifactRow] = Field(default_factory=list)
    artifacts_dir: str = Field(default="", description="the run's artifacts dir on the worker")
    harness: str
    harness_version: str
    call_sampling: list[str] = Field(
        default_factory=list,
        description="JSON of the sampling params each call of the segment was sampled "
        "with, aligned with call_policy_versions (empty: all `sampling`)",
    )
    sampling: str = Field(description="JSON of the sampling params of the segment's first call")
    seed: int | None = None
    conversation: str = Field(
        default="[]",
        description="JSON array, per call (aligned with call_policy_versions): what the "
        "protocol carried (`schemas.conversation.CallConversation`; null: not recorded)",
    )
    routed_experts: RoutedExperts | None = Field(
        default=None,
        description="the routing of prompt_ids + response_ids but the last token (None: "
        "not recorded; `routing_missing` says why when it was asked for)",
    )
    routing_missing: str = Field(
        default="", description="why a segment whose routing was asked for has none"
    )
    routing_rereads: int = Field(
        default=0, ge=0, description="tokens whose routing a later call returned again"
    )
    routing_reread_differs: int = Field(
        default=0, ge=0, description="of those, the tokens routed otherwise when read again"
    )
    schema_version: int = SCHEMA_VERSION

    @model_validator(mode="after")
    def _aligned(self) -> "SampleRow":
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError("loss_mask and logprobs must align with response_ids")
        if any(bit not in (0, 1) for bit in self.loss_mask):
            raise ValueError("loss_mask holds only 0 and 1")
        if self.status not in SAMPLE_STATUSES:
            raise ValueError(f"status {self.status} is not a sample status")
        if self.schema_version not in KNOWN_SCHEMA_VERSIONS:
            raise ValueError(f"unknown schema_version {self.schema_version}")
        if len(self.call_starts) != len(self.call_policy_versions):
            raise ValueError("call_starts must align with call_policy_versions")
        if self.call_sampling and len(self.call_sampling) != len(self.call_policy_versions):
            raise ValueError("call_sampling must align with call_policy_versions")
        if self.call_starts != sorted(self.call_starts) or any(
            not 0 <= at <= n for at in self.call_starts
        ):
            raise ValueError("call_starts must be ascending positions in response_ids")
        metrics_of(self.reward_metrics)
        metrics_of(self.step_durations, "step_durations")
        if self.rollout_status and self.rollout_status not in set(RolloutStatus):
            raise ValueError(f"rollout_status {self.rollout_status!r} is not a status")
        labels_of(self.verdict_sources, "verdict_sources")
        labels_of(self.sandbox_facts, "sandbox_facts")
        calls = conversation_of(self.conversation)
        if calls and len(calls) != len(self.call_policy_versions):
            raise ValueError("conversation must align with call_policy_versions")
        routing = self.routed_experts
        if routing is not None and (
            routing.start != 0 or routing.tokens != len(self.prompt_ids) + n - 1
        ):
            raise ValueError("routed_experts must cover prompt_ids + response_ids but the last")
        return self

    def token_policy_versions(self) -> list[str]:
        """The version that sampled each response token (prompt tokens between calls get
        the previous call's; they carry no loss)."""
        if not self.call_policy_versions:
            return [self.policy_version] * len(self.response_ids)
        return token_versions(self.call_policy_versions, self.call_starts, len(self.response_ids))


def metrics_json(metrics: dict[str, float]) -> str:
    """Canonical JSON of a verifier's metrics (sorted names), as the column holds them."""
    return json.dumps({name: float(v) for name, v in metrics.items()}, sort_keys=True)


def metrics_of(raw: str, column: str = "reward_metrics") -> dict[str, float]:
    """A `metrics_json` column as a dict; anything but an object of numbers is refused."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    ):
        raise ValueError(f"{column} must be a JSON object of numbers, got {raw!r}")
    return {name: float(v) for name, v in value.items()}


def labels_json(labels: dict[str, str]) -> str:
    """Canonical JSON of a name → text object, as `verdict_sources` and `sandbox_facts`
    hold them."""
    return json.dumps({str(k): str(v) for k, v in labels.items()}, sort_keys=True)


def labels_of(raw: str, column: str) -> dict[str, str]:
    """A `labels_json` column as a dict; anything but an object of strings is refused."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{column} must be a JSON object of strings, got {raw!r}")
    return value


def token_versions(versions: list[str], starts: list[int], n: int) -> list[str]:
    """Spread per-call versions over `n` response tokens (see `SampleRow.call_starts`)."""
    out: list[str] = []
    for i, (version, start) in enumerate(zip(versions, starts, strict=True)):
        end = starts[i + 1] if i + 1 < len(starts) else n
        if i == 0:
            start = 0
        out.extend([version] * (end - start))
    return out


CHECK_ARROW_TYPE = pa.struct(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("passed", pa.bool_(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),
        pa.field("exit_code", pa.int32()),
        pa.field("timed_out", pa.bool_(), nullable=False),
        pa.field("duration_s", pa.float64(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)
ARTIFACT_ARROW_TYPE = pa.struct(
    [
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("location", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)
ROUTED_EXPERTS_ARROW_TYPE = pa.struct(
    [
        pa.field("start", pa.int32()),
        pa.field("tokens", pa.int32()),
        pa.field("layers", pa.int32()),
        pa.field("top_k", pa.int32()),
        pa.field("dtype", pa.string()),
        pa.field("data", pa.binary()),
    ]
)
"""`schemas.routing.RoutedExperts` (its fields checked when a row is read)."""
#: Columns holding lists of models (written as lists of Arrow structs).
_MODEL_LIST_COLUMNS = ("eval_checks", "artifacts")

SAMPLE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("segment_id", pa.string(), nullable=False),
        pa.field("parent_segment_id", pa.string()),
        pa.field("link", pa.string()),
        pa.field("scene", pa.string(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("step_rewards", pa.list_(pa.float64())),
        pa.field("status", pa.string(), nullable=False),
        pa.field("policy_version", pa.string(), nullable=False),
        pa.field("call_policy_versions", pa.list_(pa.string()), nullable=False),
        pa.field("call_starts", pa.list_(pa.int32()), nullable=False),
        pa.field("call_sampling", pa.list_(pa.string()), nullable=False),
        pa.field("env_version", pa.string(), nullable=False),
        pa.field("task_source", pa.string(), nullable=False),
        pa.field("image_digest", pa.string(), nullable=False),
        pa.field("prompt_template_version", pa.string(), nullable=False),
        pa.field("reward_fn_version", pa.string(), nullable=False),
        pa.field("reward_metrics", pa.string(), nullable=False),
        pa.field("status_reason", pa.string(), nullable=False),
        pa.field("verdict_sources", pa.string(), nullable=False),
        pa.field("sandbox_facts", pa.string(), nullable=False),
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("rollout_status", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("eval_checks", pa.list_(CHECK_ARROW_TYPE), nullable=False),
        pa.field("step_durations", pa.string(), nullable=False),
        pa.field("artifacts", pa.list_(ARTIFACT_ARROW_TYPE), nullable=False),
        pa.field("artifacts_dir", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("harness_version", pa.string(), nullable=False),
        pa.field("sampling", pa.string(), nullable=False),
        pa.field("seed", pa.int64()),
        pa.field("conversation", pa.string(), nullable=False),
        pa.field("routed_experts", ROUTED_EXPERTS_ARROW_TYPE),
        pa.field("routing_missing", pa.string(), nullable=False),
        pa.field("routing_rereads", pa.int32(), nullable=False),
        pa.field("routing_reread_differs", pa.int32(), nullable=False),
        pa.field("schema_version", pa.int32(), nullable=False),
    ],
    metadata={b"agentic_rollout.schema_version": str(SCHEMA_VERSION).encode()},
)


class UnknownSchemaVersionError(ValueError):
    """A samples file was written by a schema this reader does not understand."""


def rows_to_table(rows: list[SampleRow]) -> pa.Table:
    """Validated rows → Arrow table with the contract schema (column order fixed)."""
    columns = {name: [getattr(r, name) for r in rows] for name in SAMPLE_ARROW_SCHEMA.names}
    columns["scene"] = [str(s) for s in columns["scene"]]
    columns["status"] = [str(s) for s in columns["status"]]
    for name in _MODEL_LIST_COLUMNS:
        columns[name] = [[m.model_dump() for m in models] for models in columns[name]]
    columns["routed_experts"] = [r and r.model_dump() for r in columns["routed_experts"]]
    return pa.Table.from_pydict(columns, schema=SAMPLE_ARROW_SCHEMA)


def check_schema_version(schema: pa.Schema, source: str) -> None:
    """Refuse a file whose schema-version metadata is missing or unknown."""
    raw = (schema.metadata or {}).get(b"agentic_rollout.schema_version")
    if raw is None:
        raise UnknownSchemaVersionError(f"{source}: no agentic_rollout.schema_version metadata")
    if int(raw) not in KNOWN_SCHEMA_VERSIONS:
        raise UnknownSchemaVersionError(
            f"{source}: schema_version {int(raw)} is not one of {sorted(KNOWN_SCHEMA_VERSIONS)}"
        )


class SampleSchemaMismatchError(ValueError):
    """A samples file claims a known schema version but its columns do not match it."""


def check_schema(schema: pa.Schema, source: str) -> None:
    """Refuse a file whose schema version is unknown or whose columns (names and types)
    differ from the contract's, naming every difference (the version tag alone is only
    the writer's word)."""
    check_schema_version(schema, source)
    version = int((schema.metadata or {})[b"agentic_rollout.schema_version"])
    problems: list[str] = []
    contract = schema_of(version)
    for want in contract:
        idx = schema.get_field_index(want.name)
        if idx < 0:
            problems.append(f"missing column {want.name!r} ({want.type})")
            continue
        got = schema.field(idx)
        if not got.type.equals(want.type):
            problems.append(f"column {want.name!r} is {got.type}, expected {want.type}")
    extra = [n for n in schema.names if contract.get_field_index(n) < 0]
    if extra:
        problems.append(f"unexpected column(s) {extra}")
    if problems:
        raise SampleSchemaMismatchError(
            f"{source}: does not match the samples schema v{version}: " + "; ".join(problems)
        )


@cache
def schema_of(version: int) -> pa.Schema:
    """The contract's columns as of `version` (the current schema minus later columns)."""
    later = {name for v, names in _ADDED_IN.items() if v > version for name in names}
    return pa.schema([f for f in SAMPLE_ARROW_SCHEMA if f.name not in later])


def upgrade(table: pa.Table) -> pa.Table:
    """Fill the columns an older file lacks: one call of the row's `policy_version`,
    starting at the first response token; every call sampled with the row's `sampling`;
    no known task source, the image digest its `env_version` named, no metrics; no
    status reason, verdict sources or sandbox facts; no batch, rollout status, verdict,
    checks, step durations or artifacts; no conversation; no routing."""
    if "call_policy_versions" not in table.column_names:
        versions = [[v] for v in table.column("policy_version").to_pylist()]
        table = table.append_column(
            "call_policy_versions", pa.array(versions, pa.list_(pa.string()))
        )
        table = table.append_column(
            "call_starts", pa.array([[0]] * table.num_rows, pa.list_(pa.int32()))
        )
    if "call_sampling" not in table.column_names:
        calls = table.column("call_policy_versions").to_pylist()
        sampling = table.column("sampling").to_pylist()
        each = [[s] * len(c) for s, c in zip(sampling, calls, strict=True)]
        table = table.append_column("call_sampling", pa.array(each, pa.list_(pa.string())))
    if "task_source" not in table.column_names:
        n = table.num_rows
        table = table.append_column("task_source", pa.array([""] * n, pa.string()))
        table = table.append_column("image_digest", table.column("env_version"))
        table = table.append_column("reward_metrics", pa.array(["{}"] * n, pa.string()))
    if "status_reason" not in table.column_names:
        n = table.num_rows
        table = table.append_column("status_reason", pa.array([""] * n, pa.string()))
        for name in ("verdict_sources", "sandbox_facts"):
            table = table.append_column(name, pa.array(["{}"] * n, pa.string()))
    if "batch_id" not in table.column_names:
        n = table.num_rows
        for name in ("batch_id", "rollout_status", "verdict"):
            table = table.append_column(name, pa.array([""] * n, pa.string()))
        table = table.append_column("eval_checks", pa.array([[]] * n, pa.list_(CHECK_ARROW_TYPE)))
        table = table.append_column("step_durations", pa.array(["{}"] * n, pa.string()))
        table = table.append_column("artifacts", pa.array([[]] * n, pa.list_(ARTIFACT_ARROW_TYPE)))
        table = table.append_column("artifacts_dir", pa.array([""] * n, pa.string()))
    if "conversation" not in table.column_names:
        n = table.num_rows
        table = table.append_column("conversation", pa.array(["[]"] * n, pa.string()))
    if "routed_experts" not in table.column_names:
        n = table.num_rows
        table = table.append_column("routed_experts", pa.nulls(n, ROUTED_EXPERTS_ARROW_TYPE))
        table = table.append_column("routing_missing", pa.array([""] * n, pa.string()))
        for name in ("routing_rereads", "routing_reread_differs"):
            table = table.append_column(name, pa.array([0] * n, pa.int32()))
    return table


def conform(table: pa.Table, source: str) -> pa.Table:
    """A checked table in the contract's column order and nullability, so tables from
    different files concatenate; a null where the contract forbids one, or a row of an
    unknown `schema_version`, is refused."""
    table = upgrade(table).select(SAMPLE_ARROW_SCHEMA.names)
    for want in SAMPLE_ARROW_SCHEMA:
        if not want.nullable and table.column(want.name).null_count:
            raise SampleSchemaMismatchError(f"{source}: column {want.name!r} holds nulls")
    unknown = set(table.column("schema_version").to_pylist()) - KNOWN_SCHEMA_VERSIONS
    if unknown:
        raise UnknownSchemaVersionError(f"{source}: rows with schema_version {sorted(unknown)}")
    return table.cast(SAMPLE_ARROW_SCHEMA)


def table_to_rows(table: pa.Table) -> list[SampleRow]:
    """Arrow table → validated rows (used by tests and small trainers)."""
    return [SampleRow.model_validate(r) for r in table.to_pylist()]


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def samples_uri(output: str, rollout_id: str) -> str:
    """The one file holding a rollout's samples (`rollout_id` checked: a path part)."""
    name = f"{check_rollout_id(rollout_id)}.parquet"
    if is_s3(output):
        return f"{output.rstrip('/')}/{name}"
    return str(Path(output) / name)
