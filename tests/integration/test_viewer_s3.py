"""The viewer over samples on S3 (moto's S3 server on loopback): the batch page lists the
rollouts and a rollout's pages open, as they do for a local directory."""

import boto3
import pytest
from starlette.testclient import TestClient

from devstack.sample_batch import rollout_rows
from rollout_client.samples_reader import SamplesReader
from rollout_client.storage import table_bytes
from schemas.samples import rows_to_table
from tests.integration.test_samples_schema_s3 import BUCKET, s3  # noqa: F401 (fixture)
from viewer.app import viewer_app

pytestmark = pytest.mark.integration


def test_an_s3_batch_opens(s3: str) -> None:  # noqa: F811
    for rid in ("r-1", "r-2"):
        table = rows_to_table(rollout_rows(rid, "t", reward=1.0 if rid == "r-1" else 0.0))
        boto3.client("s3").put_object(
            Bucket=BUCKET, Key=f"b1/{rid}.parquet", Body=table_bytes(table)
        )
    app = viewer_app(SamplesReader(f"s3://{BUCKET}/b1"))
    c = TestClient(app, base_url="http://localhost")
    batch = c.get("/").text
    assert "/rollout/r-1" in batch and "/rollout/r-2" in batch
    rollout = c.get("/rollout/r-2")
    assert rollout.status_code == 200 and 'class="tok t' in rollout.text
    assert "diff.patch: not looked" in c.get("/rollout/r-2/evaluation").text
