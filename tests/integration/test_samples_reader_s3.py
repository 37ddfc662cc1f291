"""The samples reader on S3 (moto's S3 server on loopback): a batch under a prefix opens
as it does on disk, the manifest beside it included, and a prefix holding no samples is
refused."""

import json

import boto3
import pytest

from rollout_client.samples_reader import NotASamplesDirectoryError, SamplesReader
from rollout_client.storage import table_bytes
from schemas.samples import rows_to_table
from tests.integration.test_samples_schema_s3 import BUCKET, s3  # noqa: F401 - the fixture
from tests.unit.test_samples_reader import NOT_FOUND, _rows, eval_error_outcome, ok_outcome

pytestmark = pytest.mark.integration


def _put(key: str, body: bytes) -> None:
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=body)


def test_a_batch_on_s3_reads_as_on_disk(s3: str) -> None:  # noqa: F811 - the fixture
    for rid, task, outcome in (
        ("b1-hello-0", "hello", ok_outcome("/w/artifacts/b1-hello-0/attempt-1")),
        ("b1-py-0", "py", eval_error_outcome()),
    ):
        _put(f"out/b1/{rid}.parquet", table_bytes(rows_to_table(_rows(rid, "b1", task, outcome))))
    manifest = {"rollouts": [{"rollout_id": "b1-gone-0", "workflow_status": "FAILED",
                              "error": "provision_sandbox: image not found"}]}  # fmt: skip
    _put("out/b1/_manifest.json", json.dumps(manifest).encode())
    reader = SamplesReader(f"s3://{BUCKET}/out")
    assert reader.batch_ids() == ["b1"] and reader.kind_of("b1-py-0") == "rollout"
    view = reader.batch("b1")
    assert view.status_counts() == {"ok": 1, "eval_error": 1, "FAILED": 1}
    assert set(view.errors()) == {
        "provision_sandbox: image not found",
        "check 'tests' could not run (exit 127)",
    }
    py = reader.rollout("b1-py-0")
    assert py.samples_uri == f"s3://{BUCKET}/out/b1/b1-py-0.parquet"
    assert (py.status, py.checks[0].exit_code, py.checks[0].detail) == (
        "eval_error",
        127,
        NOT_FOUND,
    )
    assert [a.state for a in reader.rollout("b1-hello-0").artifacts] == ["not looked"] * 2 + [
        "remote"
    ]
    with pytest.raises(NotASamplesDirectoryError, match="0 object"):
        SamplesReader(f"s3://{BUCKET}/nothing-here")
