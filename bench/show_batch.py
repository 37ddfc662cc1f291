"""`rollout show` on a large batch: time to first output, and to the end.

A batch of `--rollouts` rollouts (default 1,000) is written the way the collect step
writes one (`schemas.samples.rows_to_table` → `rollout_client.storage.write_table`, one
`<rollout_id>.parquet` per rollout, schema v6 with the evaluation's checks, step
durations and artifacts) under a scratch directory, with a `_manifest.json` as `rollout
run` leaves it. Each rollout has `--calls` calls in one segment (a `--prompt-tokens`
prompt, `--sampled` tokens per call); one in ten is an `eval_error` with one of three
reasons and a full-length check detail. Writing it is not timed.

Then, side by side in one run, `--repeats` times each (median printed):
- `rollout show --help`: the command's start-up floor (Python, imports);
- `rollout show BATCH` on a 10-rollout batch of the same shape;
- `rollout show BATCH` on the large batch;
- `rollout show ROLLOUT` of one rollout in the large batch;
each as the user runs it (`python -m workers.cli`, a child process), timed from spawn to
its first byte of output and to its exit. The figure is the large batch's time to first
output, and its ratio to the small batch's (what the batch's size costs).

Run: `python -m bench.show_batch [--rollouts 1000] [--calls 8] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from activities.samples import artifact_rows, check_rows, step_durations
from rollout_client.storage import write_table
from schemas.evaluation import CheckResult, EvaluationResult
from schemas.outcome import ArtifactRef, RolloutStatus, RunOutcome
from schemas.samples import SampleRow, labels_json, metrics_json, rows_to_table, samples_uri
from schemas.scenes import Scene

REPO = Path(__file__).resolve().parents[1]
REASONS = (
    "check tests could not run (exit 127): /bin/sh: 1: python: not found",
    "check tests timed out after 300.0s: collecting ...",
    "verifier test.sh (exit 1): reward.txt is empty; output tail: FAILED",
)


def _outcome(i: int, rng: random.Random, artifacts_dir: str) -> RunOutcome:
    broken = i % 10 == 3
    detail = "".join(rng.choice("abcdefgh \n") for _ in range(4000))
    check = CheckResult(
        name="tests",
        kind="command",
        passed=not broken and i % 2 == 0,
        score=0.0 if broken or i % 2 else 1.0,
        exit_code=127 if broken else i % 2,
        duration_s=rng.uniform(0.1, 30),
        detail=detail,
    )
    evaluation = EvaluationResult(
        status="eval_error" if broken else "ok",
        reward=None if broken else check.score,
        verdict="error" if broken else ("pass" if check.passed else "fail"),
        checks=[check],
        reward_fn_version="eval4-bench",
        duration_s=check.duration_s,
        error=REASONS[i % 3] if broken else None,
    )
    return RunOutcome(
        status=RolloutStatus.eval_error if broken else RolloutStatus.ok,
        harness="command",
        harness_version="bench",
        reward_fn_version="eval4-bench",
        evaluation=evaluation,
        timings={
            "setup": rng.uniform(0.1, 2),
            "agent": rng.uniform(5, 300),
            "after_run": rng.uniform(1, 40),
        },
        artifacts_dir=artifacts_dir,
        artifacts=[
            ArtifactRef(name=n, kind=n.split(".")[0], local_path=f"{artifacts_dir}/{n}", size=100)
            for n in ("evaluation.json", "diff.patch", "metrics.json", "agent.stdout.log")
        ],
    )


def _rows(batch: str, i: int, args: argparse.Namespace, rng: random.Random) -> list[SampleRow]:
    task = f"task-{i % 50}"
    rid = f"{batch}-{task}-{i // 50}"
    outcome = _outcome(i, rng, f"/data/worker/artifacts/{rid}/attempt-1")
    n = args.calls * args.sampled
    masked = outcome.status is RolloutStatus.eval_error
    calls = list(range(0, n, args.sampled))
    return [
        SampleRow(
            rollout_id=rid,
            task_id=task,
            group_id=f"{batch}-{task}",
            sample_index=i // 50,
            segment_id=f"seg-{i}",
            scene=Scene.main,
            prompt_ids=[rng.randrange(50_000) for _ in range(args.prompt_tokens)],
            response_ids=[rng.randrange(50_000) for _ in range(n)],
            loss_mask=[0 if masked else 1] * n,
            logprobs=[-rng.random() for _ in range(n)],
            reward=0.0 if masked else (outcome.reward or 0.0),
            status=RolloutStatus.infra_error if masked else RolloutStatus.ok,
            policy_version="p1",
            call_policy_versions=["p1"] * len(calls),
            call_starts=calls,
            env_version="sha256:bench",
            prompt_template_version="tmpl",
            reward_fn_version=outcome.reward_fn_version,
            reward_metrics=metrics_json(outcome.reward_metrics),
            status_reason=outcome.status_reason,
            verdict_sources=labels_json(outcome.verdict_sources),
            batch_id=batch,
            rollout_status=str(outcome.status),
            verdict=outcome.verdict or "",
            eval_checks=check_rows(outcome),
            step_durations=metrics_json(step_durations(outcome)),
            artifacts=artifact_rows(outcome),
            artifacts_dir=outcome.artifacts_dir or "",
            harness=outcome.harness,
            harness_version=outcome.harness_version,
            sampling='{"temperature": 1.0}',
        )
    ]


def write_batch(root: Path, batch: str, n: int, args: argparse.Namespace) -> list[str]:
    """A batch of `n` rollouts under `root/batch`, as the collect step writes them."""
    rng = random.Random(n)
    out = root / batch
    rids: list[str] = []
    manifest = []
    for i in range(n):
        rows = _rows(batch, i, args, rng)
        rid = rows[0].rollout_id
        write_table(rows_to_table(rows), samples_uri(str(out), rid))
        rids.append(rid)
        manifest.append(
            {
                "rollout_id": rid,
                "workflow_status": "COMPLETED",
                "result": {"status": rows[0].rollout_status, "duration_s": rng.uniform(10, 400)},
            }
        )
    (out / "_manifest.json").write_text(json.dumps({"batch_id": batch, "rollouts": manifest}))
    return rids


def time_command(argv: list[str]) -> tuple[float, float, int]:
    """(seconds to the first byte of output, seconds to exit, bytes printed)."""
    env = {**os.environ, "COLUMNS": "160", "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *argv], stdout=subprocess.PIPE, cwd=REPO, env=env
    )
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    rest = proc.stdout.read()
    code = proc.wait()
    t_end = time.perf_counter() - t0
    if code != 0 or not first:
        raise SystemExit(f"{argv}: exit {code}")
    return t_first, t_end, len(first) + len(rest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--sampled", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-show-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_batch(root, "small", 10, args)
        rids = write_batch(root, "large", args.rollouts, args)
        size = sum(f.stat().st_size for f in (root / "large").iterdir()) / 1e6
        print(
            f"wrote {args.rollouts} rollouts ({size:.0f} MB, {args.calls} calls × "
            f"{args.sampled} tokens, {args.prompt_tokens}-token prompts) in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        cases = {
            "show --help (start-up floor)": ["show", "--help"],
            "show BATCH, 10 rollouts": ["show", "small", "--samples", str(root)],
            f"show BATCH, {args.rollouts} rollouts": ["show", "large", "--samples", str(root)],
            f"show ROLLOUT in {args.rollouts}": ["show", rids[3], "--samples", str(root)],
        }
        times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in cases}
        for _ in range(args.repeats):  # interleaved: load on the machine hits every case
            for name, argv in cases.items():
                times[name].append(time_command(argv))
        print(f"{'case':<34} {'first output':>13} {'exit':>9} {'printed':>9}")
        medians: dict[str, float] = {}
        for name, runs in times.items():
            first = statistics.median(r[0] for r in runs)
            end = statistics.median(r[1] for r in runs)
            medians[name] = first
            print(f"{name:<34} {first:>11.2f} s {end:>7.2f} s {runs[0][2]:>7} B")
        small, large = list(medians.values())[1:3]
        print(f"large/small batch, time to first output: {large / small:.2f}x")


if __name__ == "__main__":
    main()
