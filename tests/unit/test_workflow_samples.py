"""Trajectory → sample rows: the rules collect_trajectory applies, without services."""

from datetime import UTC, datetime

from activities.samples import build_rows, sampling_json, summarize
from schemas.conversation import CallConversation, ConvMessage, ConvToolCall, conversation_of
from schemas.evaluation import CheckResult, EvaluationResult
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.rollout import CollectRequest, SessionRef
from schemas.samples import SampleRow
from schemas.sampling import SamplingParams
from schemas.trajectory import RecordedCall, Segment, Trajectory


def call(
    cid: str, seg: str, *, status: str = "ok", finish: str = "stop", seed: int = 5
) -> RecordedCall:
    return RecordedCall(
        call_id=cid,
        segment_id=seg,
        scene="main",
        protocol="openai_chat",
        path="/v1/chat/completions",
        status=status,
        match="clean",
        prompt_ids=[1, 2],
        output_ids=[7, 8],
        output_logprobs=[-0.1, -0.2],
        new_prompt_tokens=2,
        finish_reason=finish,
        sampling=SamplingParams(temperature=1.0, max_tokens=8, seed=seed),
        policy_version="pol-3",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        duration_s=0.1,
    )


def segment(sid: str, calls: list[str], *, scene: str = "main", trainable: bool = True) -> Segment:
    return Segment(
        segment_id=sid,
        scene=scene,
        trainable=trainable,
        prompt_ids=[1, 2],
        response_ids=[7, 8, 3, 7, 8],
        loss_mask=[1, 1, 0, 1, 1],
        logprobs=[-0.1, -0.2, 0.0, -0.1, -0.2],
        call_ids=calls,
    )


def trajectory(calls: list[RecordedCall], segments: list[Segment]) -> Trajectory:
    return Trajectory(
        session_id="s1",
        rollout_id="r1",
        policy_version="pol-3",
        closed=True,
        prompt_template_version="tmpl-abc",
        calls=calls,
        segments=segments,
    )


def request(
    status: RolloutStatus = RolloutStatus.ok, reward: float | None = 1.0, **kw
) -> CollectRequest:
    evaluation = EvaluationResult(
        status="ok" if reward is not None else "eval_error",
        reward=reward,
        step_rewards=[0.5, 1.0] if reward is not None else None,
        verdict="pass" if reward else ("error" if reward is None else "fail"),
        reward_fn_version="eval-9",
        metrics={"tests_passed": 2, "coverage": 0.5},
    )
    outcome = RunOutcome(
        status=status,
        evaluation=evaluation,
        harness="command",
        harness_version="cmd-1",
        reward_fn_version="eval-9",
    )
    return CollectRequest(
        rollout_id="r1",
        batch_id="b",
        task_id="t",
        group_id="b-t",
        sample_index=1,
        seed=99,
        session=SessionRef(
            session_id="s1",
            token="x",
            openai_base_url="http://g/v1",
            anthropic_base_url="http://g",
            gateway_url="http://g",
            owner_queue="q",
        ),
        env_version=kw.pop("env_version", "sha256:img"),
        outcome=outcome,
        sampling=SamplingParams(temperature=0.7),
        output="/tmp/x",
        **kw,
    )


def test_ok_rows_carry_segment_tokens_reward_and_lineage() -> None:
    traj = trajectory([call("c1", "g1"), call("c2", "g1")], [segment("g1", ["c1", "c2"])])
    [row] = build_rows(traj, request())
    assert isinstance(row, SampleRow)
    assert row.status == "ok" and row.reward == 1.0 and row.step_rewards == [0.5, 1.0]
    assert row.response_ids == [7, 8, 3, 7, 8] and row.loss_mask == [1, 1, 0, 1, 1]
    assert (row.rollout_id, row.task_id, row.group_id, row.sample_index) == ("r1", "t", "b-t", 1)
    assert row.policy_version == "pol-3" and row.env_version == "sha256:img"
    assert row.image_digest == "sha256:img"  # a request without it: env_version was the image
    assert row.prompt_template_version == "tmpl-abc" and row.reward_fn_version == "eval-9"
    assert (row.harness, row.harness_version) == ("command", "cmd-1")
    # the sampling actually used (from the recorded call), not the task's request
    assert row.sampling == sampling_json(SamplingParams(temperature=1.0, max_tokens=8, seed=5))
    assert row.seed == 5


def test_failed_engine_call_masks_its_segment() -> None:
    traj = trajectory(
        [call("c1", "g1"), call("c2", "g2", status="engine_error")],
        [segment("g1", ["c1"]), segment("g2", ["c2"])],
    )
    rows = {r.segment_id: r for r in build_rows(traj, request())}
    assert rows["g1"].status == "ok" and 1 in rows["g1"].loss_mask
    assert rows["g2"].status == "infra_error"
    assert set(rows["g2"].loss_mask) == {0} and rows["g2"].reward == 0.0
    assert rows["g2"].step_rewards is None


def test_missing_call_record_is_an_infra_error() -> None:
    traj = trajectory([call("c1", "g1")], [segment("g1", ["c1", "lost"])])
    [row] = build_rows(traj, request())
    assert row.status == "infra_error" and sum(row.loss_mask) == 0


def test_agent_timeout_stays_trainable_with_zero_reward() -> None:
    traj = trajectory([call("c1", "g1")], [segment("g1", ["c1"])])
    [row] = build_rows(traj, request(RolloutStatus.agent_timeout, reward=0.7))
    assert row.status == "agent_timeout" and row.reward == 0.0
    assert row.loss_mask == [1, 1, 0, 1, 1]


def test_a_sandbox_the_agent_broke_stays_trainable_with_zero_reward() -> None:
    traj = trajectory([call("c1", "g1")], [segment("g1", ["c1"])])
    [row] = build_rows(traj, request(RolloutStatus.agent_broke_sandbox, reward=0.7))
    assert row.status == "agent_broke_sandbox" and row.reward == 0.0
    assert row.loss_mask == [1, 1, 0, 1, 1]


def test_eval_error_masks_everything() -> None:
    traj = trajectory([call("c1", "g1")], [segment("g1", ["c1"])])
    [row] = build_rows(traj, request(RolloutStatus.eval_error, reward=None))
    assert row.status == "infra_error" and sum(row.loss_mask) == 0


def test_length_stop_is_truncated() -> None:
    traj = trajectory([call("c1", "g1", finish="length")], [segment("g1", ["c1"])])
    [row] = build_rows(traj, request())
    assert row.status == "truncated" and row.reward == 1.0


def test_non_trainable_and_unwanted_scenes_are_skipped() -> None:
    traj = trajectory(
        [call("c1", "g1"), call("c2", "g2"), call("c3", "g3")],
        [
            segment("g1", ["c1"]),
            segment("g2", ["c2"], scene="title", trainable=False),
            segment("g3", ["c3"], scene="compaction"),
        ],
    )
    assert {r.segment_id for r in build_rows(traj, request())} == {"g1", "g3"}
    only_main = build_rows(traj, request(trainable_scenes=["main"]))
    assert [r.segment_id for r in only_main] == ["g1"]


def test_summary_counts_tokens_and_statuses() -> None:
    traj = trajectory(
        [call("c1", "g1"), call("c2", "g2", status="engine_error")],
        [segment("g1", ["c1"]), segment("g2", ["c2"])],
    )
    rows = build_rows(traj, request())
    summary = summarize(traj, rows, "/x.parquet", closed=True)
    assert summary.num_samples == 2 and summary.num_calls == 2 and summary.failed_calls == 1
    assert summary.trainable_tokens == 4
    assert summary.statuses == {"ok": 1, "infra_error": 1}
    assert summary.limit_refusals == {}


def test_the_summary_says_which_limits_refused_the_agents_calls() -> None:
    """Refused calls are never recorded; the session's count of them travels with the
    summary (and from it to the rollout's result)."""
    traj = trajectory([call("c1", "g1")], [segment("g1", ["c1"])]).model_copy(
        update={"limit_refusals": {"max_stored_bytes": 2, "max_concurrent_calls": 1}}
    )
    summary = summarize(traj, build_rows(traj, request()), None, closed=True)
    assert summary.limit_refusals == {"max_stored_bytes": 2, "max_concurrent_calls": 1}


def test_a_segment_spanning_a_policy_update_carries_each_calls_version() -> None:
    """Call c1 was sampled by pol-3, then the gateway loaded pol-4 and c2 (same
    conversation) was sampled by it: the row keeps both, with where c2's tokens start,
    so a trainer can tell each token's version."""
    second = call("c2", "g1").model_copy(update={"policy_version": "pol-4"})
    seg = segment("g1", ["c1", "c2"]).model_copy(update={"call_starts": [0, 3]})
    [row] = build_rows(trajectory([call("c1", "g1"), second], [seg]), request())
    assert row.policy_version == "pol-3"
    assert (row.call_policy_versions, row.call_starts) == (["pol-3", "pol-4"], [0, 3])
    assert row.token_policy_versions() == ["pol-3"] * 3 + ["pol-4"] * 2


def test_each_call_of_a_segment_carries_its_own_sampling() -> None:
    """The agent chose another temperature for its second call (an agent-chosen field):
    the row keeps each call's parameters, aligned with the calls; `sampling` stays the
    first call's. A segment from an older gateway (no call starts) carries none."""
    first = call("c1", "g1")
    second = call("c2", "g1").model_copy(
        update={"sampling": SamplingParams(temperature=0.2, max_tokens=8, seed=5)}
    )
    seg = segment("g1", ["c1", "c2"]).model_copy(update={"call_starts": [0, 3]})
    [row] = build_rows(trajectory([first, second], [seg]), request())
    assert row.call_sampling == [sampling_json(first.sampling), sampling_json(second.sampling)]
    assert row.call_sampling[0] != row.call_sampling[1]
    assert row.sampling == row.call_sampling[0]
    [old] = build_rows(trajectory([first, second], [segment("g1", ["c1", "c2"])]), request())
    assert old.call_sampling == [] and old.call_policy_versions == []


def test_rows_carry_the_tasks_source_its_image_and_the_verifiers_metrics() -> None:
    """env_version is what the workflow resolved (the task's content hash here); the
    image and the source ride beside it; the metrics are the verifier's, as canonical
    JSON, on every row, masked ones too (they say what was measured)."""
    traj = trajectory(
        [call("c1", "g1"), call("c2", "g2", status="engine_error")],
        [segment("g1", ["c1"]), segment("g2", ["c2"])],
    )
    req = request(
        env_version="sha256:task",
        image_digest="sha256:img",
        task_source="harbor:tasks/hello",
    )
    ok, failed = build_rows(traj, req)
    assert failed.status == "infra_error"
    for row in (ok, failed):
        assert (row.env_version, row.image_digest, row.task_source) == (
            "sha256:task",
            "sha256:img",
            "harbor:tasks/hello",
        )
        assert row.reward_metrics == '{"coverage": 0.5, "tests_passed": 2.0}'


def test_rows_say_why_their_reward_is_what_it_is() -> None:
    """A rollout the agent broke says what it broke; each verdict names the evidence it
    was read from; provisioning's facts ride along; on every row, masked ones too."""
    traj = trajectory(
        [call("c1", "g1"), call("c2", "g2", status="engine_error")],
        [segment("g1", ["c1"]), segment("g2", ["c2"])],
    )
    req = request(status=RolloutStatus.agent_broke_sandbox, reward=0.0)
    assert req.outcome.evaluation is not None
    req.outcome.evaluation = req.outcome.evaluation.model_copy(
        update={
            "status": "agent_broke_sandbox",
            "damage": "test.sh wrote no reward after the agent ran",
            "checks": [
                CheckResult(name="tests", kind="reward_file", passed=False, score=0.0,
                            source="reward.txt"),
                CheckResult(name="lint", kind="command", passed=True, score=1.0),
            ],
        }
    )  # fmt: skip
    req = req.model_copy(update={"sandbox_facts": {"repo_history": "trimmed"}})
    rows = build_rows(traj, req)
    assert [r.status for r in rows] == ["agent_broke_sandbox", "infra_error"]
    for row in rows:
        assert "test.sh wrote no reward after the agent ran" in row.status_reason
        assert row.verdict_sources == '{"tests": "reward.txt"}'
        assert row.sandbox_facts == '{"repo_history": "trimmed"}'
    ok = build_rows(traj, request())[0]
    assert (ok.status_reason, ok.verdict_sources, ok.sandbox_facts) == ("", "{}", "{}")


def test_rows_carry_each_calls_conversation_aligned_with_the_calls() -> None:
    """The row keeps what each of its calls carried, in call order; a call an older
    gateway recorded without it is null, and a segment without call starts has none."""
    ask = CallConversation(
        history=0,
        messages=[ConvMessage(role="user", content="What is here?")],
        reply=ConvMessage(
            role="assistant", tool_calls=[ConvToolCall(name="bash", arguments="{}", id="t1")]
        ),
    )
    first = call("c1", "g1").model_copy(update={"conversation": ask})
    seg = segment("g1", ["c1", "c2"]).model_copy(update={"call_starts": [0, 3]})
    [row] = build_rows(trajectory([first, call("c2", "g1")], [seg]), request())
    assert conversation_of(row.conversation) == [ask, None]
    [old] = build_rows(trajectory([first], [segment("g1", ["c1"])]), request())
    assert old.conversation == "[]"
