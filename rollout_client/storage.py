"""Where sample files live: a local directory or S3 (`s3://bucket/prefix`).

Why one small module used by both sides: the collect activity writes a rollout's samples
and the trainer client reads them back; both must agree on the layout
(`<output>/<rollout_id>.parquet`) and on the schema-version check. S3 goes through
boto3, which honours the standard AWS environment (credentials, `AWS_ENDPOINT_URL` for
MinIO/moto). Writes are atomic: a reader never sees half a file, and a retried write
replaces the previous one (exactly one set of samples per rollout). Local writes are
fsynced (file, then directory) so a machine crash cannot leave a named but empty file.
"""

import io
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.samples import (
    SAMPLE_ARROW_SCHEMA,
    SampleRow,
    check_schema,
    conform,
    is_s3,
    rows_to_table,
)


def write_samples(rows: list[SampleRow], path: Path | str, filesystem: object = None) -> None:
    """Write rows as one Parquet file; `filesystem` is a pyarrow filesystem (e.g. S3)."""
    pq.write_table(rows_to_table(rows), str(path), filesystem=filesystem, compression="zstd")


def read_samples(path: Path | str, filesystem: object = None) -> pa.Table:
    """Read one Parquet file or a directory of them; every file's schema (version tag,
    column names and types) and every row's `schema_version` must be known, else nothing
    is returned."""
    dataset = pq.ParquetDataset(str(path), filesystem=filesystem)
    versions = set()
    for fragment in dataset.fragments:
        check_schema(fragment.physical_schema, fragment.path)
        versions.add(fragment.physical_schema.metadata[b"agentic_rollout.schema_version"])
    if len(versions) <= 1:
        return conform(dataset.read(), str(path))
    # files of several schema versions: each is brought up to date on its own
    return pa.concat_tables(
        conform(pq.read_table(f.path, filesystem=dataset.filesystem), f.path)
        for f in dataset.fragments
    )


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise ValueError(f"S3 URI needs a bucket: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


@lru_cache(maxsize=4)
def _s3_client(endpoint: str | None) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint) if endpoint else boto3.client("s3")


def s3_client() -> Any:
    return _s3_client(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))


def table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def write_table(table: pa.Table, uri: str) -> int:
    """Write one Parquet file atomically; returns its size in bytes. Blocking."""
    data = table_bytes(table)
    if is_s3(uri):
        bucket, key = _split_s3(uri)
        s3_client().put_object(Bucket=bucket, Key=key, Body=data)
        return len(data)
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)
    _fsync_dir(path.parent)  # and the rename itself survives a machine crash
    return len(data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_s3_object(bucket: str, key: str) -> pa.Table:
    body = s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    source = f"s3://{bucket}/{key}"
    table = pq.read_table(io.BytesIO(body))
    check_schema(table.schema, source)
    return conform(table, source)


def read_table(uri: str) -> pa.Table:
    """One file, a directory of files, or an S3 object/prefix → one Arrow table.

    Every file's schema (version tag, column names and types) is checked; a mismatch
    raises naming it (never a guess).
    """
    if not is_s3(uri):
        return read_samples(uri)
    bucket, key = _split_s3(uri)
    if key.endswith(".parquet"):
        return _read_s3_object(bucket, key)
    prefix = key.rstrip("/") + "/" if key else ""
    tables: list[pa.Table] = []
    paginator = s3_client().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith(".parquet"):
                tables.append(_read_s3_object(bucket, obj["Key"]))
    return concat(tables)


def concat(tables: list[pa.Table]) -> pa.Table:
    """Concatenate sample tables (an empty list gives an empty table with the schema)."""
    if not tables:
        return SAMPLE_ARROW_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def read_many(uris: list[str]) -> pa.Table:
    """The samples of several rollouts as one table."""
    return concat([read_table(u) for u in uris])
