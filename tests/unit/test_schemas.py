"""Schema contracts: strict models, Parquet round trip and refusal of unknown schema
versions (the sampling rules are in test_sampling_control.py)."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from rollout_client.storage import read_samples, write_samples
from schemas.conversation import (
    CallConversation,
    ConvMessage,
    ConvToolCall,
    conversation_json,
    conversation_of,
)
from schemas.evaluation import RewardFileCheck
from schemas.outcome import RolloutStatus
from schemas.routing import RoutedExperts
from schemas.samples import (
    SAMPLE_ARROW_SCHEMA,
    SCHEMA_VERSION,
    SampleRow,
    UnknownSchemaVersionError,
    rows_to_table,
    table_to_rows,
)
from schemas.scenes import Scene
from schemas.session import SessionConfig
from schemas.tasks import RolloutTask, TaskSource, load_tasks


def make_row(**overrides: object) -> SampleRow:
    data: dict[str, object] = {
        "rollout_id": "r1",
        "task_id": "t1",
        "group_id": "g1",
        "segment_id": "seg1",
        "scene": Scene.main,
        "prompt_ids": [1, 2, 3],
        "response_ids": [4, 5, 6],
        "loss_mask": [1, 0, 1],
        "logprobs": [-0.5, 0.0, -1.25],
        "reward": 1.0,
        "status": RolloutStatus.ok,
        "policy_version": "p1",
        "env_version": "sha256:abc",
        "prompt_template_version": "tmpl",
        "reward_fn_version": "rf1",
        "harness": "command",
        "harness_version": "1",
        "sampling": '{"temperature": 1.0}',
        "seed": 7,
    }
    data.update(overrides)
    return SampleRow.model_validate(data)


def as_version(table: pa.Table, version: int, drop: list[str]) -> pa.Table:
    """The table as a writer of `version` made it: without the later columns (`drop`,
    and those of v5 to v8 for an older version), tagged."""
    later = (
        (V5_COLUMNS if version < 5 else [])
        + (V6_COLUMNS if version < 6 else [])
        + (V7_COLUMNS if version < 7 else [])
        + (V8_COLUMNS if version < 8 else [])
    )
    table = table.drop_columns(drop + later)
    return table.set_column(
        table.schema.get_field_index("schema_version"),
        "schema_version",
        pa.array([version] * table.num_rows, pa.int32()),
    ).replace_schema_metadata({b"agentic_rollout.schema_version": str(version).encode()})


V4_COLUMNS = ["task_source", "image_digest", "reward_metrics"]
V5_COLUMNS = ["status_reason", "verdict_sources", "sandbox_facts"]
V6_COLUMNS = [
    "batch_id",
    "rollout_status",
    "verdict",
    "eval_checks",
    "step_durations",
    "artifacts",
    "artifacts_dir",
]
V7_COLUMNS = ["conversation"]
V8_COLUMNS = ["routed_experts", "routing_missing", "routing_rereads", "routing_reread_differs"]


def test_session_config_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="rollout_idd"):
        SessionConfig.model_validate({"rollout_id": "x", "rollout_idd": "typo"})


def test_sample_row_alignment_is_checked() -> None:
    with pytest.raises(ValidationError, match="align"):
        make_row(loss_mask=[1, 1])
    with pytest.raises(ValidationError, match="only 0 and 1"):
        make_row(loss_mask=[1, 2, 1])


def test_parquet_round_trip(tmp_path) -> None:
    rows = [make_row(), make_row(segment_id="seg2", scene=Scene.compaction, seed=None)]
    path = tmp_path / "s.parquet"
    write_samples(rows, path)
    table = read_samples(path)
    assert table.schema.equals(SAMPLE_ARROW_SCHEMA, check_metadata=False)
    back = table_to_rows(table)
    assert back == rows


def test_reader_refuses_unknown_schema_version(tmp_path) -> None:
    table = rows_to_table([make_row()])
    future = table.replace_schema_metadata({b"agentic_rollout.schema_version": b"99"})
    path = tmp_path / "future.parquet"
    pq.write_table(future, path)
    with pytest.raises(UnknownSchemaVersionError, match="99"):
        read_samples(path)
    bare = tmp_path / "bare.parquet"
    pq.write_table(pa.table({"x": [1]}), bare)
    with pytest.raises(UnknownSchemaVersionError, match="no agentic_rollout"):
        read_samples(bare)


def test_reader_checks_each_file_of_a_directory(tmp_path) -> None:
    write_samples([make_row()], tmp_path / "a.parquet")
    future = rows_to_table([make_row()]).replace_schema_metadata(
        {b"agentic_rollout.schema_version": b"99"}
    )
    pq.write_table(future, tmp_path / "b.parquet")
    with pytest.raises(UnknownSchemaVersionError):
        read_samples(tmp_path)
    (tmp_path / "b.parquet").unlink()
    assert read_samples(tmp_path).num_rows == 1


def test_sample_rows_refuse_a_rollout_only_status() -> None:
    """eval_error describes a rollout; its rows are written as infra_error (masked)."""
    with pytest.raises(ValidationError, match="not a sample status"):
        make_row(status=RolloutStatus.eval_error)


def test_a_task_file_with_a_malformed_check_is_refused_at_load(tmp_path: Path) -> None:
    """The success check is part of the task contract: a typo fails when the file is read,
    naming the line, instead of failing a rollout inside a sandbox."""
    bad = {
        "task_id": "t1",
        "prompt": "p",
        "harness": {"name": "command"},
        "evaluation": {"checks": [{"kind": "command", "comand": "pytest"}]},
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:1: invalid task"):
        load_tasks(path)


@pytest.mark.parametrize("reward_dir", ["/", ".", "..", "../up", "/tests", "/tests/out/"])
def test_a_reward_dir_the_evaluation_would_wipe_is_refused_at_load(reward_dir: str) -> None:
    """The reward dir is emptied before the verifier runs: the root, the check's own
    directory or one above it, or the tests dir would take the answer or the tests."""
    with pytest.raises(ValidationError, match=r"reward_dir .* would be emptied"):
        RewardFileCheck(reward_dir=reward_dir)
    assert RewardFileCheck(reward_dir="out/verifier").reward_dir == "out/verifier"


def test_step_metrics_without_scored_rollouts_read_back() -> None:
    """A step (or final held-out run) where no rollout was scored has no reward mean: it is
    written as JSON null and read back as None. (It was NaN, which JSON writes as null and
    then refused to read, so a rerun could not resume.)"""
    from schemas.training import FinalEval, StepMetrics

    fields: dict[str, object] = {
        name: 0 if info.annotation is int else 0.0
        for name, info in StepMetrics.model_fields.items()
        if info.is_required()
    }
    fields.update(step=1, policy="run-v1", sampled_by="run-v0", reward_mean=None)
    line = StepMetrics.model_validate(fields).model_dump_json()
    assert '"reward_mean":null' in line
    assert StepMetrics.model_validate_json(line).reward_mean is None
    final = FinalEval(policy="run-v1", heldout_reward=None, heldout_rollouts=4)
    assert FinalEval.model_validate_json(final.model_dump_json()).heldout_reward is None


def test_version_1_files_read_as_one_call_per_row(tmp_path) -> None:
    """A samples file written before per-call versions (schema v1: no call columns)
    still reads, each row as one call of its `policy_version` from the first token;
    a directory mixing v1 and v2 files reads as one table."""
    table = as_version(
        rows_to_table([make_row()]),
        1,
        ["call_policy_versions", "call_starts", "call_sampling", *V4_COLUMNS],
    )
    pq.write_table(table, tmp_path / "old.parquet")
    [old] = table_to_rows(read_samples(tmp_path / "old.parquet"))
    assert (old.call_policy_versions, old.call_starts, old.schema_version) == (["p1"], [0], 1)
    assert old.call_sampling == [old.sampling]
    write_samples(
        [make_row(call_policy_versions=["p1", "p2"], call_starts=[0, 2])], tmp_path / "new.parquet"
    )
    both = read_samples(tmp_path)
    assert sorted(both.column("call_policy_versions").to_pylist()) == [["p1"], ["p1", "p2"]]


def test_version_2_files_read_with_every_call_sampled_as_the_row(tmp_path) -> None:
    """A v2 file (per-call versions, no per-call sampling) reads with each call given the
    row's `sampling`, and concatenates with v3 files whose calls differ."""
    two = make_row(call_policy_versions=["p1", "p2"], call_starts=[0, 2])
    table = as_version(rows_to_table([two]), 2, ["call_sampling", *V4_COLUMNS])
    pq.write_table(table, tmp_path / "old.parquet")
    [old] = table_to_rows(read_samples(tmp_path / "old.parquet"))
    assert old.call_sampling == [two.sampling, two.sampling] and old.schema_version == 2
    new = make_row(
        call_policy_versions=["p1", "p1"],
        call_starts=[0, 2],
        call_sampling=['{"temperature": 1.0}', '{"temperature": 0.5}'],
    )
    write_samples([new], tmp_path / "new.parquet")
    both = read_samples(tmp_path).column("call_sampling").to_pylist()
    assert sorted(both) == sorted([old.call_sampling, new.call_sampling])


def test_lineage_columns_round_trip(tmp_path) -> None:
    row = make_row(
        env_version="sha256:task",
        task_source="harbor:tasks/hello",
        image_digest="sha256:img",
        reward_metrics='{"tests_passed": 3.0}',
        status_reason="the verifier wrote no reward after the agent ran",
        verdict_sources='{"tests": "reward.txt"}',
        sandbox_facts='{"repo_history": "trimmed"}',
    )
    write_samples([row], tmp_path / "s.parquet")
    table = read_samples(tmp_path / "s.parquet")
    assert table.schema.metadata[b"agentic_rollout.schema_version"] == b"8"
    [back] = table_to_rows(table)
    assert back == row and back.schema_version == SCHEMA_VERSION == 8


def two_calls_conversation() -> str:
    """Two calls: a user's question answered by a tool call, then the tool's result."""
    ask = CallConversation(
        history=0,
        messages=[ConvMessage(role="user", content="What is here?")],
        tools=["bash"],
        reply=ConvMessage(
            role="assistant",
            reasoning="list them",
            tool_calls=[ConvToolCall(name="bash", arguments='{"command": "ls"}', id="c1")],
        ),
        finish_reason="stop",
    )
    result = CallConversation(
        history=2,
        messages=[ConvMessage(role="tool", content="hello.py", tool_call_id="c1")],
        reply=ConvMessage(role="assistant", content="It holds hello.py."),
    )
    return conversation_json([ask, result])


def test_the_conversation_column_round_trips(tmp_path) -> None:
    raw = two_calls_conversation()
    row = make_row(call_policy_versions=["p1", "p1"], call_starts=[0, 2], conversation=raw)
    write_samples([row], tmp_path / "s.parquet")
    [back] = table_to_rows(read_samples(tmp_path / "s.parquet"))
    assert back == row
    ask, result = conversation_of(back.conversation)
    assert ask is not None and ask.reply is not None
    assert ask.reply.tool_calls[0].name == "bash" and ask.reply.reasoning == "list them"
    assert result is not None and result.messages[0].content == "hello.py"


def test_the_conversation_must_align_with_the_calls() -> None:
    with pytest.raises(ValidationError, match="conversation must align"):
        make_row(conversation=two_calls_conversation())  # one call, two entries
    with pytest.raises(ValidationError, match="conversation: not a list of calls"):
        make_row(conversation='{"role": "user"}')


def routing_of(tokens: int) -> RoutedExperts:
    ids = (np.arange(tokens * 4 * 2).reshape(tokens, 4, 2) * 5) % 8
    return RoutedExperts.of(ids)


def test_the_routed_experts_column_round_trips_narrowest(tmp_path) -> None:
    """Five tokens (six but the last) of 4 layers x 2 experts, ids below 8: one byte
    each, read back the same; ids past 255 take two."""
    row = make_row(routed_experts=routing_of(5), routing_rereads=2, routing_reread_differs=1)
    assert row.routed_experts is not None and row.routed_experts.dtype == "uint8"
    assert len(row.routed_experts.data) == 5 * 4 * 2
    write_samples([row], tmp_path / "s.parquet")
    table = read_samples(tmp_path / "s.parquet")
    [back] = table_to_rows(table)
    assert back == row
    np.testing.assert_array_equal(back.routed_experts.array(), row.routed_experts.array())  # type: ignore[union-attr]
    assert RoutedExperts.of(np.full((1, 4, 2), 256)).dtype == "uint16"


def test_routed_experts_must_cover_the_tokens_but_the_last() -> None:
    with pytest.raises(ValidationError, match="routed_experts must cover"):
        make_row(routed_experts=routing_of(6))  # six rows: the last token has none
    with pytest.raises(ValidationError, match="needs 40"):
        RoutedExperts(start=0, tokens=5, layers=4, top_k=2, dtype="uint8", data=b"\0" * 39)


def test_version_7_files_read_with_no_routing(tmp_path) -> None:
    table = as_version(rows_to_table([make_row(verdict="pass")]), 7, [])
    assert "routed_experts" not in table.column_names
    pq.write_table(table, tmp_path / "old.parquet")
    write_samples([make_row(routed_experts=routing_of(5))], tmp_path / "new.parquet")
    old, new = sorted(table_to_rows(read_samples(tmp_path)), key=lambda r: r.schema_version)
    assert (old.routed_experts, old.routing_missing, old.schema_version) == (None, "", 7)
    assert new.routed_experts == routing_of(5)


def test_version_6_files_read_with_no_conversation(tmp_path) -> None:
    table = as_version(rows_to_table([make_row(verdict="pass")]), 6, [])
    assert "conversation" not in table.column_names
    pq.write_table(table, tmp_path / "old.parquet")
    [old] = table_to_rows(read_samples(tmp_path / "old.parquet"))
    assert (old.conversation, old.verdict, old.schema_version) == ("[]", "pass", 6)


def test_version_3_files_read_with_the_image_as_their_digest(tmp_path) -> None:
    """Before v4, env_version was the image digest: a v3 row reads with that as its
    `image_digest`, no task source and no metrics, and concatenates with v4 files."""
    table = as_version(rows_to_table([make_row()]), 3, V4_COLUMNS)
    pq.write_table(table, tmp_path / "old.parquet")
    [old] = table_to_rows(read_samples(tmp_path / "old.parquet"))
    assert (old.env_version, old.image_digest) == ("sha256:abc", "sha256:abc")
    assert (old.task_source, old.reward_metrics, old.schema_version) == ("", "{}", 3)
    write_samples(
        [make_row(task_source="jsonl:t1", image_digest="sha256:x")], tmp_path / "n.parquet"
    )
    both = read_samples(tmp_path)
    assert sorted(both.column("task_source").to_pylist()) == ["", "jsonl:t1"]


def test_version_4_files_read_with_no_reason_sources_or_facts(tmp_path) -> None:
    table = as_version(rows_to_table([make_row(status_reason="x")]), 4, [])
    pq.write_table(table, tmp_path / "old.parquet")
    [old] = table_to_rows(read_samples(tmp_path / "old.parquet"))
    assert (old.status_reason, old.verdict_sources, old.sandbox_facts) == ("", "{}", "{}")
    assert old.schema_version == 4


def test_a_current_file_without_a_lineage_column_is_refused(tmp_path) -> None:
    table = rows_to_table([make_row()]).drop_columns(["sandbox_facts"])
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="schema v8: missing column 'sandbox_facts'"):
        read_samples(tmp_path / "bad.parquet")


@pytest.mark.parametrize("column", ["verdict_sources", "sandbox_facts"])
@pytest.mark.parametrize("raw", ["[]", '{"tests": 1}', "not json"])
def test_labels_must_be_an_object_of_strings(column: str, raw: str) -> None:
    with pytest.raises(ValidationError, match=f"{column} must be a JSON object of strings"):
        make_row(**{column: raw})


@pytest.mark.parametrize("raw", ["[]", '{"passed": "yes"}', '{"ok": true}', "not json"])
def test_reward_metrics_must_be_an_object_of_numbers(raw: str) -> None:
    with pytest.raises(ValidationError, match="reward_metrics must be a JSON object of numbers"):
        make_row(reward_metrics=raw)


def test_env_version_is_the_tasks_content_hash_else_the_image() -> None:
    """A task from a source with a content hash is versioned by it (it names the
    environment's definition, whatever image was built from it); otherwise by the image
    the sandbox ran. A task without a source is named by its id."""
    plain = RolloutTask.model_validate({"task_id": "t1", "prompt": "p", "harness": {"name": "c"}})
    assert plain.env_version("sha256:img") == "sha256:img"
    assert plain.source_label() == "jsonl:t1"
    hashed = TaskSource(format="harbor", ref="tasks/hello", content_hash="sha256:task")
    task = plain.model_copy(update={"source": hashed})
    assert task.env_version("sha256:img") == "sha256:task"
    assert task.source_label() == "harbor:tasks/hello"
    unhashed = plain.model_copy(update={"source": TaskSource(format="swebench", ref="x__y-1")})
    assert unhashed.env_version("sha256:img") == "sha256:img"
    assert unhashed.source_label() == "swebench:x__y-1"


def test_a_v3_file_without_call_sampling_is_refused(tmp_path) -> None:
    """The version tag alone is the writer's word: a v3 file lacking the column is named."""
    table = as_version(rows_to_table([make_row()]), 3, V4_COLUMNS).drop_columns(["call_sampling"])
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="missing column 'call_sampling'"):
        read_samples(tmp_path / "bad.parquet")


def test_call_sampling_must_align_with_the_calls() -> None:
    with pytest.raises(ValidationError, match="call_sampling must align"):
        make_row(call_policy_versions=["p1", "p2"], call_starts=[0, 2], call_sampling=["{}"])


def test_call_starts_must_align_and_ascend() -> None:
    with pytest.raises(ValidationError, match="align with call_policy_versions"):
        make_row(call_policy_versions=["p1", "p2"], call_starts=[0])
    with pytest.raises(ValidationError, match="ascending"):
        make_row(call_policy_versions=["p1", "p2"], call_starts=[2, 0])
