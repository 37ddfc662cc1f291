"""Trajectory → training samples: one row per trainable segment, with full lineage.

Pure functions (no I/O) so every rule is unit-testable:
- only segments the Gateway marked trainable (and, if the task says so, only its
  trainable scenes) become rows;
- a segment touched by a failed engine call (or missing call records) is an
  *infrastructure* failure: kept for visibility, status `infra_error`, loss mask zeroed,
  so a trainer never learns from it;
- an agent that hit its budget keeps its segments trainable with reward 0
  (`agent_timeout`): running out of time is the policy's doing; so does an agent that
  broke its sandbox so that it could not be evaluated (`agent_broke_sandbox`);
- an evaluator that broke gives no reward at all: rows are masked like infra errors;
- a segment whose last call stopped on the token limit is `truncated`;
- each call keeps its own policy version and sampling parameters (`call_sampling`):
  with agent-chosen fields, the calls of one segment may be sampled differently;
- every row names the task's source, its environment (`env_version`, `image_digest`,
  `sandbox_facts`), the verifier's metrics as it reported them, what each verdict was
  read from and why the status is what it is (a masked row keeps them: they say what
  was measured, not what is trained);
- every row carries its calls' conversation as the protocol carried it (each call's new
  messages and parsed reply), so a viewer shows what the agent saw and did;
- every row carries its segment's routed experts when the session recorded them whole
  (MoE routing replay), else why not;
- every row carries the rollout's own status, the evaluation's verdict and checks
  (detail tails capped), the run's step durations and its artifacts, so whoever reads
  the samples can say why a reward is what it is without the worker's disk.
"""

import json
from collections import Counter

from schemas.conversation import conversation_json
from schemas.outcome import RolloutStatus, RunOutcome, final_status, sample_status
from schemas.rollout import CollectRequest, SamplesSummary
from schemas.samples import (
    CHECK_DETAIL_CHARS,
    ArtifactRow,
    CheckRow,
    SampleRow,
    labels_json,
    metrics_json,
)
from schemas.sampling import SamplingParams
from schemas.trajectory import CallStatus, Segment, Trajectory


def sampling_json(params: SamplingParams) -> str:
    """Canonical JSON of the sampling params a call was sampled with (stable for
    grouping); a field left out was the engine's default."""
    return json.dumps(params.model_dump(mode="json", exclude_none=True), sort_keys=True)


def check_rows(outcome: RunOutcome) -> list[CheckRow]:
    """The evaluation's checks as rows carry them: each detail cut to its tail."""
    checks = outcome.evaluation.checks if outcome.evaluation else []
    return [
        CheckRow(
            name=c.name,
            kind=c.kind,
            passed=c.passed,
            score=c.score,
            exit_code=c.exit_code,
            timed_out=c.timed_out,
            duration_s=c.duration_s,
            detail=_tail(c.detail, CHECK_DETAIL_CHARS),
        )
        for c in checks
    ]


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def step_durations(outcome: RunOutcome) -> dict[str, float]:
    """Seconds per step of the run (the runtime's phases; the evaluation's own time)."""
    steps = dict(outcome.timings)
    if outcome.evaluation is not None:
        steps["evaluate"] = outcome.evaluation.duration_s
    return steps


def artifact_rows(outcome: RunOutcome) -> list[ArtifactRow]:
    return [
        ArtifactRow(name=a.name, kind=a.kind, location=a.uri or a.local_path or "", size=a.size)
        for a in outcome.artifacts
    ]


def _wanted(seg: Segment, scenes: set[str] | None) -> bool:
    return seg.trainable and (scenes is None or str(seg.scene) in scenes)


def build_rows(traj: Trajectory, req: CollectRequest) -> list[SampleRow]:
    calls = {c.call_id: c for c in traj.calls}
    scenes = set(req.trainable_scenes) if req.trainable_scenes is not None else None
    outcome = req.outcome
    image = req.image_digest if req.image_digest is not None else req.env_version
    metrics = metrics_json(outcome.reward_metrics)
    reason = outcome.status_reason
    sources = labels_json(outcome.verdict_sources)
    facts = labels_json(req.sandbox_facts)
    checks = check_rows(outcome)
    steps = metrics_json(step_durations(outcome))
    artifacts = artifact_rows(outcome)
    rows: list[SampleRow] = []
    for seg in traj.segments:
        if not _wanted(seg, scenes):
            continue
        seg_calls = [calls[c] for c in seg.call_ids if c in calls]
        # each call's version and where its tokens start: a rollout may span an update
        # (a segment without call_starts, from an older gateway, has one version)
        starts = seg.call_starts if len(seg.call_starts) == len(seg.call_ids) else []
        sampled = [(c, at) for c, at in zip(seg.call_ids, starts, strict=False) if c in calls]
        status = sample_status(
            outcome.status,
            calls_complete=len(seg_calls) == len(seg.call_ids),
            calls_ok=all(c.status == CallStatus.ok for c in seg_calls),
            hit_token_limit=bool(seg_calls) and seg_calls[-1].finish_reason == "length",
        )
        masked = status is RolloutStatus.infra_error
        reward = 0.0 if masked else (outcome.reward or 0.0)
        first = seg_calls[0] if seg_calls else None
        used = first.sampling if first is not None else req.sampling
        seed = used.seed if used.seed is not None else req.seed
        rows.append(
            SampleRow(
                rollout_id=req.rollout_id,
                task_id=req.task_id,
                group_id=req.group_id,
                sample_index=req.sample_index,
                segment_id=seg.segment_id,
                parent_segment_id=seg.parent_id,
                link=seg.link,
                scene=seg.scene,
                prompt_ids=seg.prompt_ids,
                response_ids=seg.response_ids,
                loss_mask=[0] * len(seg.loss_mask) if masked else seg.loss_mask,
                logprobs=seg.logprobs,
                reward=reward,
                step_rewards=None if masked else outcome.step_rewards,
                status=status,
                policy_version=first.policy_version if first else traj.policy_version,
                call_policy_versions=[calls[c].policy_version for c, _ in sampled],
                call_starts=[start for _, start in sampled],
                call_sampling=[sampling_json(calls[c].sampling) for c, _ in sampled],
                env_version=req.env_version,
                task_source=req.task_source,
                image_digest=image,
                prompt_template_version=traj.prompt_template_version,
                reward_fn_version=outcome.reward_fn_version,
                reward_metrics=metrics,
                status_reason=reason,
                verdict_sources=sources,
                sandbox_facts=facts,
                batch_id=req.batch_id,
                verdict=outcome.verdict or "",
                eval_checks=checks,
                step_durations=steps,
                artifacts=artifacts,
                artifacts_dir=outcome.artifacts_dir or "",
                harness=outcome.harness,
                harness_version=outcome.harness_version,
                sampling=sampling_json(used),
                seed=seed,
                conversation=conversation_json([calls[c].conversation for c, _ in sampled]),
                routed_experts=seg.routed_experts,
                routing_missing=seg.routing_missing or "",
                routing_rereads=seg.routing_rereads,
                routing_reread_differs=seg.routing_reread_differs,
            )
        )
    rollout = str(final_status(outcome.status, [str(r.status) for r in rows]))
    return [r.model_copy(update={"rollout_status": rollout}) for r in rows]


def summarize(
    traj: Trajectory, rows: list[SampleRow], uri: str | None, closed: bool
) -> SamplesSummary:
    return SamplesSummary(
        uri=uri,
        num_samples=len(rows),
        num_calls=len(traj.calls),
        failed_calls=sum(1 for c in traj.calls if c.status != CallStatus.ok),
        trainable_tokens=sum(sum(r.loss_mask) for r in rows),
        statuses=dict(Counter(str(r.status) for r in rows)),
        session_closed=closed,
        limit_refusals=dict(traj.limit_refusals),
    )
