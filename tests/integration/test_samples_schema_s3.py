"""Samples read back from S3 (moto's S3 server on loopback) and from disk are checked
against the Parquet schema itself, not only the file's schema-version tag: a file that
claims the known version but has other columns is refused with an error naming the
difference, and nothing of the read is returned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from devstack.ports import free_port
from rollout_client.client import RolloutClient
from rollout_client.storage import read_table, table_bytes
from schemas.rollout import RolloutResult
from schemas.samples import (
    SAMPLE_ARROW_SCHEMA,
    SCHEMA_VERSION,
    SampleRow,
    SampleSchemaMismatchError,
    UnknownSchemaVersionError,
    rows_to_table,
)

pytestmark = pytest.mark.integration
BUCKET = "samples"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server on a free loopback port, used through AWS_ENDPOINT_URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
    }.items():
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
    try:
        yield url
    finally:
        server.stop()


def good_table(rollout_id: str = "b-t-0") -> pa.Table:
    row = SampleRow(
        rollout_id=rollout_id, task_id="t", group_id="b-t", segment_id="s0", scene="main",
        prompt_ids=[1, 2], response_ids=[3], loss_mask=[1], logprobs=[-0.5], reward=1.0,
        status="ok", policy_version="p", env_version="e", prompt_template_version="tpl",
        reward_fn_version="r", harness="command", harness_version="1", sampling="{}",
    )  # fmt: skip
    return rows_to_table([row])


def with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """`table` with column `name` replaced, keeping the schema-version tag."""
    i = table.schema.get_field_index(name)
    out = table.set_column(i, pa.field(name, values.type), values)
    return out.replace_schema_metadata(SAMPLE_ARROW_SCHEMA.metadata)


def put(key: str, table: pa.Table) -> str:
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=table_bytes(table))
    return f"s3://{BUCKET}/{key}"


MISMATCH = f"does not match the samples schema v{SCHEMA_VERSION}"


def bad_tables() -> dict[str, tuple[pa.Table, str]]:
    t = good_table()
    return {
        "reward as text": (
            with_column(t, "reward", pa.array(["1.0"])),
            MISMATCH + ": column 'reward' is string, expected double",
        ),
        "token ids as int64": (
            with_column(t, "response_ids", pa.array([[3]], pa.list_(pa.int64()))),
            MISMATCH + ": "
            "column 'response_ids' is list<element: int64>, expected list<item: int32>",
        ),
        "missing loss_mask": (
            t.drop_columns(["loss_mask"]).replace_schema_metadata(SAMPLE_ARROW_SCHEMA.metadata),
            MISMATCH + ": missing column 'loss_mask' (list<item: int8>)",
        ),
        "extra column": (
            t.append_column("advantage", pa.array([0.5])).replace_schema_metadata(
                SAMPLE_ARROW_SCHEMA.metadata
            ),
            MISMATCH + ": unexpected column(s) ['advantage']",
        ),
        "null reward": (
            with_column(t, "reward", pa.array([None], pa.float64())),
            "column 'reward' holds nulls",
        ),
    }


@pytest.mark.parametrize("case", list(bad_tables()))
def test_s3_read_refuses_a_file_whose_columns_do_not_match(s3: str, case: str) -> None:
    table, why = bad_tables()[case]
    uri = put(f"runs/{case.replace(' ', '-')}.parquet", table)
    with pytest.raises(SampleSchemaMismatchError) as info:
        read_table(uri)
    assert str(info.value) == f"{uri}: {why}"


def test_s3_prefix_read_names_the_bad_file_and_returns_nothing(s3: str) -> None:
    put("batch/b-t-0.parquet", good_table("b-t-0"))
    bad = put("batch/b-t-1.parquet", bad_tables()["reward as text"][0])
    with pytest.raises(SampleSchemaMismatchError, match=f"^{bad}: .*'reward' is string"):
        read_table(f"s3://{BUCKET}/batch")


def test_trainer_client_load_samples_checks_the_columns(s3: str) -> None:
    ok = put("c/b-t-0.parquet", good_table("b-t-0"))
    bad = put("c/b-t-1.parquet", bad_tables()["missing loss_mask"][0])
    results = [RolloutResult.model_construct(samples_uri=uri) for uri in (ok, bad)]
    with pytest.raises(SampleSchemaMismatchError, match="missing column 'loss_mask'"):
        RolloutClient.load_samples(results)
    assert RolloutClient.load_samples(results[:1]).num_rows == 1


def test_s3_read_refuses_rows_of_an_unknown_schema_version(s3: str) -> None:
    future = SCHEMA_VERSION + 1
    t = with_column(good_table(), "schema_version", pa.array([future], pa.int32()))
    uri = put("v/b-t-0.parquet", t)
    with pytest.raises(UnknownSchemaVersionError, match=rf"rows with schema_version \[{future}\]"):
        read_table(uri)


def test_good_files_read_the_same_from_s3_and_disk(s3: str, tmp_path: Path) -> None:
    put("g/b-t-0.parquet", good_table("b-t-0"))
    put("g/b-t-1.parquet", good_table("b-t-1"))
    pq.write_table(good_table("b-t-0"), tmp_path / "b-t-0.parquet")
    from_s3 = read_table(f"s3://{BUCKET}/g")
    assert from_s3.schema.equals(SAMPLE_ARROW_SCHEMA)
    assert from_s3.column("rollout_id").to_pylist() == ["b-t-0", "b-t-1"]
    assert read_table(str(tmp_path)).equals(from_s3.slice(0, 1))


@pytest.mark.parametrize("case", ["reward as text", "missing loss_mask"])
def test_disk_read_refuses_a_file_whose_columns_do_not_match(tmp_path: Path, case: str) -> None:
    table, why = bad_tables()[case]
    pq.write_table(table, tmp_path / "b-t-0.parquet")
    with pytest.raises(SampleSchemaMismatchError, match=MISMATCH) as i:
        read_table(str(tmp_path / "b-t-0.parquet"))
    assert why in str(i.value)
