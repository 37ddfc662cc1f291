"""A rollout id becomes a file name (`<output>/<rollout_id>.parquet`, artifact dirs) and
a workflow id, so every boundary that accepts one refuses anything but a safe path
part, with an error that says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from rollout_client.client import RolloutClient
from schemas.rollout import CollectRequest, HarnessRequest, ProvisionRequest, SessionRequest
from schemas.samples import samples_uri
from schemas.tasks import ROLLOUT_ID_MAX, RolloutRequest, RolloutTask, load_tasks

BAD_IDS = {
    "../x": "not a safe path part",
    "/": "not a safe path part",
    "a/b": "not a safe path part",
    "a\x00b": "not a safe path part",
    ".hidden": "not a safe path part",
    "": "empty rollout id",
    "x" * (ROLLOUT_ID_MAX + 1): f"is {ROLLOUT_ID_MAX + 1} characters long",
}
TASK = {"task_id": "t1", "prompt": "p", "harness": {"name": "command"}}


@pytest.mark.parametrize(("rid", "why"), BAD_IDS.items(), ids=range(len(BAD_IDS)))
def test_rollout_request_refuses_unsafe_rollout_id(rid: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        RolloutRequest.model_validate(
            {"rollout_id": rid, "batch_id": "b", "group_id": "g", "task": TASK, "output": "o"}
        )


@pytest.mark.parametrize(
    "model", [SessionRequest, ProvisionRequest, HarnessRequest, CollectRequest]
)
def test_activity_requests_refuse_unsafe_rollout_id(model: type[BaseModel]) -> None:
    """The activities' inputs are a boundary too (anything can start a workflow)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate({"rollout_id": "../../etc/x"})
    bad = [e for e in info.value.errors() if e["loc"] == ("rollout_id",)]
    assert len(bad) == 1 and "not a safe path part" in bad[0]["msg"]


@pytest.mark.parametrize("rid", ["../x", "a/b", ""])
def test_samples_uri_refuses_unsafe_rollout_id(tmp_path: Path, rid: str) -> None:
    with pytest.raises(ValueError, match="rollout id"):
        samples_uri(str(tmp_path), rid)
    with pytest.raises(ValueError, match="rollout id"):
        samples_uri("s3://bucket/prefix", rid)


def test_plan_refuses_ids_too_long_together() -> None:
    """batch_id and task_id are each valid, but their rollout id would not fit a file
    name: the batch fails when it is planned, before any rollout runs."""
    task = RolloutTask.model_validate({**TASK, "task_id": "t" * 128})
    with pytest.raises(ValueError, match=r"batch_id 'bbbb.*task_id 'tttt.*use shorter ids"):
        RolloutClient(client=None).plan([task], "out", batch_id="b" * 128)  # type: ignore[arg-type]


def test_safe_ids_pass_everywhere(tmp_path: Path) -> None:
    client = RolloutClient(client=None)  # type: ignore[arg-type]
    batch, reqs = client.plan([RolloutTask.model_validate(TASK)], str(tmp_path), 2, "b-1")
    assert batch.rollout_ids == ["b-1-t1-0", "b-1-t1-1"]
    assert samples_uri(str(tmp_path), reqs[0].rollout_id) == str(tmp_path / "b-1-t1-0.parquet")
    longest = "a" * ROLLOUT_ID_MAX
    assert samples_uri("s3://b/p", longest) == f"s3://b/p/{longest}.parquet"


@pytest.mark.parametrize(
    ("task_id", "why"),
    [
        ("../x", "task id '../x' is not a safe path part"),
        ("/", "task id '/' is not a safe path part"),
        ("a\x00b", "task id 'a\\x00b' is not a safe path part"),
        ("", "empty task id"),
        ("x" * 129, "is 129 characters long"),
    ],
)
def test_load_tasks_names_the_line_of_an_unsafe_task_id(
    tmp_path: Path, task_id: str, why: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(TASK) + "\n" + json.dumps({**TASK, "task_id": task_id}) + "\n")
    with pytest.raises(ValueError, match=r"(?s)tasks.jsonl:2: invalid task: .*task_id.*") as info:
        load_tasks(path)
    assert why in str(info.value)
