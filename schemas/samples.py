"""Training-sample rows, their Arrow schema, and a Parquet writer/reader.

This is the contract with trainers. Every row carries full lineage so a sample can be
traced to the policy, environment, template, reward function and harness that made it.
Readers refuse a `schema_version` they do not know rather than guess at its meaning.
"""

from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from schemas.base import StrictModel
from schemas.outcome import SAMPLE_STATUSES, RolloutStatus
from schemas.scenes import Scene

SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = frozenset({1})


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
    policy_version: str
    env_version: str
    prompt_template_version: str
    reward_fn_version: str
    harness: str
    harness_version: str
    sampling: str = Field(description="JSON of the sampling params actually used")
    seed: int | None = None
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
        return self


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
        pa.field("env_version", pa.string(), nullable=False),
        pa.field("prompt_template_version", pa.string(), nullable=False),
        pa.field("reward_fn_version", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("harness_version", pa.string(), nullable=False),
        pa.field("sampling", pa.string(), nullable=False),
        pa.field("seed", pa.int64()),
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
    return pa.Table.from_pydict(columns, schema=SAMPLE_ARROW_SCHEMA)


def write_samples(rows: list[SampleRow], path: Path | str, filesystem: object = None) -> None:
    """Write rows as one Parquet file; `filesystem` is a pyarrow filesystem (e.g. S3)."""
    pq.write_table(rows_to_table(rows), str(path), filesystem=filesystem, compression="zstd")


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
    problems: list[str] = []
    for want in SAMPLE_ARROW_SCHEMA:
        idx = schema.get_field_index(want.name)
        if idx < 0:
            problems.append(f"missing column {want.name!r} ({want.type})")
            continue
        got = schema.field(idx)
        if not got.type.equals(want.type):
            problems.append(f"column {want.name!r} is {got.type}, expected {want.type}")
    extra = [n for n in schema.names if SAMPLE_ARROW_SCHEMA.get_field_index(n) < 0]
    if extra:
        problems.append(f"unexpected column(s) {extra}")
    if problems:
        raise SampleSchemaMismatchError(
            f"{source}: does not match the samples schema v{SCHEMA_VERSION}: " + "; ".join(problems)
        )


def conform(table: pa.Table, source: str) -> pa.Table:
    """A checked table in the contract's column order and nullability, so tables from
    different files concatenate; a null where the contract forbids one, or a row of an
    unknown `schema_version`, is refused."""
    table = table.select(SAMPLE_ARROW_SCHEMA.names)
    for want in SAMPLE_ARROW_SCHEMA:
        if not want.nullable and table.column(want.name).null_count:
            raise SampleSchemaMismatchError(f"{source}: column {want.name!r} holds nulls")
    unknown = set(table.column("schema_version").to_pylist()) - KNOWN_SCHEMA_VERSIONS
    if unknown:
        raise UnknownSchemaVersionError(f"{source}: rows with schema_version {sorted(unknown)}")
    return table.cast(SAMPLE_ARROW_SCHEMA)


def read_samples(path: Path | str, filesystem: object = None) -> pa.Table:
    """Read one Parquet file or a directory of them; every file's schema (version tag,
    column names and types) and every row's `schema_version` must be known, else nothing
    is returned."""
    dataset = pq.ParquetDataset(str(path), filesystem=filesystem)
    for fragment in dataset.fragments:
        check_schema(fragment.physical_schema, fragment.path)
    return conform(dataset.read(), str(path))


def table_to_rows(table: pa.Table) -> list[SampleRow]:
    """Arrow table → validated rows (used by tests and small trainers)."""
    return [SampleRow.model_validate(r) for r in table.to_pylist()]
