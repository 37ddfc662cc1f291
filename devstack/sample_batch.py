"""A batch's samples directory made without running one: for the viewer's page tests,
its bench and its screenshots (a rollout of any size, in seconds).

The rows are real `SampleRow`s in the contract's Arrow schema, and the manifest and
artifacts have the shapes `rollout run` and the worker leave; only the tokens and
texts are made up.
"""

import json
import random
from pathlib import Path

import pyarrow.parquet as pq

from schemas.conversation import CallConversation, ConvMessage, ConvToolCall, conversation_json
from schemas.evaluation import CheckResult, EvaluationResult
from schemas.samples import ArtifactRow, CheckRow, SampleRow, rows_to_table
from schemas.scenes import Scene

#: Where the made-up worker kept its artifacts, as the rows record it.
WORKER_DIR = "/var/lib/rollout-worker/artifacts"
#: The files each rollout's rows record (name, kind), as the hooks name them.
ARTIFACTS = [("evaluation.json", "evaluation"), ("diff.patch", "diff"), ("logs/agent.log", "log")]


def rollout_rows(
    rollout_id: str,
    task_id: str,
    *,
    calls: int = 3,
    tokens_per_call: int = 20,
    prompt_tokens: int = 30,
    reward: float = 1.0,
    status: str = "ok",
    status_reason: str = "",
    vocab: int = 200,
    seed: int = 0,
    prompt_ids: list[int] | None = None,
    turns: list[tuple[list[int], list[int]]] | None = None,
    rollout_status: str = "ok",
    evaluation: EvaluationResult | None = None,
    batch_id: str = "b1",
    last_words: str = "The tests pass now.",
    conversation: list[CallConversation | None] | None = None,
) -> list[SampleRow]:
    """A main segment of `calls` calls (half of each call's tokens sampled, half the tool
    result that followed) and a compaction segment continuing it, carrying `evaluation`
    and the artifacts `write_artifacts` leaves as the worker records them. `turns`
    (each call's sampled ids and the ids that followed it) replaces the random calls of
    the main segment. Each call's conversation is a tool loop: the task, then a `bash`
    call answered by its result, and `last_words` as the final reply (`conversation`
    replaces the main segment's)."""
    evaluation = evaluation or passed_evaluation()
    rnd = random.Random(seed)
    rows = []
    for k, (segment, scene, parent) in enumerate(
        [("s0", Scene.main, None), ("s1", Scene.compaction, "s0")]
    ):
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        starts: list[int] = []
        half = tokens_per_call // 2
        made = [
            (
                [rnd.randrange(vocab) for _ in range(half)],
                [rnd.randrange(vocab) for _ in range(tokens_per_call - half)],
            )
            for _ in range(calls if k == 0 else 1)
        ]
        for sampled, after in turns if turns and k == 0 else made:
            starts.append(len(response))
            response += sampled + after
            mask += [1] * len(sampled) + [0] * len(after)
            logprobs += [-rnd.random() * 5 for _ in sampled] + [0.0] * len(after)
        n = len(starts) if k == 0 else calls
        versions = [f"v{min(i // max(1, n // 2), 1)}" for i in range(len(starts))]
        rows.append(
            SampleRow(
                rollout_id=rollout_id,
                task_id=task_id,
                group_id=f"g-{task_id}",
                segment_id=f"{rollout_id}-{segment}",
                parent_segment_id=f"{rollout_id}-{parent}" if parent else None,
                link="continues" if parent else None,
                scene=scene,
                prompt_ids=prompt_ids or [rnd.randrange(vocab) for _ in range(prompt_tokens)],
                response_ids=response,
                loss_mask=mask,
                logprobs=logprobs,
                reward=reward,
                status=status,
                policy_version=versions[0],
                call_policy_versions=versions,
                call_starts=starts,
                env_version="env-1",
                task_source="jsonl:tasks.jsonl",
                image_digest="sha256:" + "0" * 64,
                prompt_template_version="tpl-1",
                reward_fn_version="eval4-abc",
                status_reason=status_reason,
                batch_id=batch_id,
                rollout_status=rollout_status,
                verdict=evaluation.verdict,
                eval_checks=[
                    CheckRow(**c.model_dump(exclude={"tests", "source"})) for c in evaluation.checks
                ],
                step_durations=json.dumps({"provision": 0.5, "agent": 2.0, "evaluate": 0.25}),
                artifacts=[
                    ArtifactRow(
                        name=name, kind=kind, location=f"{WORKER_DIR}/{rollout_id}/attempt-1/{name}"
                    )
                    for name, kind in ARTIFACTS
                ],
                artifacts_dir=f"{WORKER_DIR}/{rollout_id}/attempt-1",
                harness="bash_tool",
                harness_version="1.0",
                sampling='{"temperature": 1.0}',
                conversation=conversation_json(
                    conversation
                    if conversation is not None and k == 0
                    else tool_loop(len(starts), last_words)
                ),
            )
        )
    return rows


def tool_loop(calls: int, last_words: str) -> list[CallConversation | None]:
    """`calls` calls of an agent that runs `ls` until its last call, which says `last_words`."""
    made: list[CallConversation | None] = []
    for i in range(calls):
        if i == 0:
            said = [
                ConvMessage(role="system", content="You are a coding agent."),
                ConvMessage(role="user", content="Fix the failing test."),
            ]
        else:
            said = [ConvMessage(role="tool", content=f"file{i}.py", tool_call_id=f"call-{i - 1}")]
        last = i == calls - 1
        reply = ConvMessage(
            role="assistant",
            reasoning=f"Step {i}: look around.",
            content=last_words if last else None,
            tool_calls=[]
            if last
            else [ConvToolCall(name="bash", arguments='{"command": "ls"}', id=f"call-{i}")],
        )
        made.append(
            CallConversation(
                history=0 if i == 0 else 2 * i + 1, messages=said, tools=["bash"], reply=reply
            )
        )
    return made


def write_rollout(out: Path, rows: list[SampleRow]) -> Path:
    path = out / f"{rows[0].rollout_id}.parquet"
    pq.write_table(rows_to_table(rows), path)
    return path


def write_artifacts(
    data_dir: Path, rollout_id: str, evaluation: EvaluationResult, diff: str, log: str
) -> Path:
    """What a worker leaves in its data dir for one attempt (see `ARTIFACTS`)."""
    attempt = data_dir / "artifacts" / rollout_id / "attempt-1"
    (attempt / "logs").mkdir(parents=True, exist_ok=True)
    (attempt / "evaluation.json").write_text(evaluation.model_dump_json(indent=2))
    (attempt / "diff.patch").write_text(diff)
    (attempt / "logs" / "agent.log").write_text(log)
    return attempt


def passed_evaluation() -> EvaluationResult:
    check = CheckResult(
        name="answer", kind="file", passed=True, score=1.0, detail="answer.txt holds 42"
    )
    return EvaluationResult(
        status="ok", reward=1.0, verdict="pass", checks=[check], reward_fn_version="eval4-abc"
    )


def eval_error(reason: str) -> EvaluationResult:
    check = CheckResult(
        name="tests", kind="command", passed=False, score=0.0, exit_code=127, detail=reason
    )
    return EvaluationResult(
        status="eval_error",
        reward=None,
        verdict="error",
        checks=[check],
        reward_fn_version="eval4-abc",
        error=f"check 'tests' could not run: {reason}",
    )


def write_manifest(out: Path, batch_id: str, results: list[dict[str, object]]) -> None:
    """`_manifest.json` as `rollout run` writes it (the fields the viewer reads)."""
    manifest = {"batch_id": batch_id, "output": str(out), "rollouts": results}
    (out / "_manifest.json").write_text(json.dumps(manifest, indent=2))


def result(rollout_id: str, task_id: str, status: str, reward: float | None, **kw: object) -> dict:
    return {
        "rollout_id": rollout_id,
        "workflow_status": "COMPLETED",
        "result": {
            "rollout_id": rollout_id,
            "task_id": task_id,
            "status": status,
            "reward": reward,
            "duration_s": kw.pop("duration_s", 3.5),
            "harness": "bash_tool",
            **kw,
        },
    }
