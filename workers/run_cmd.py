"""`rollout run PATH`: submit a batch, show live progress, print a summary.

PATH is a JSONL file of tasks or a dataset (a Harbor task directory or a directory of
them, SWE-bench instances with `--format swebench`; see `workers/task_source_cmd.py`
for the options a dataset needs).

Samples are written by the workers (one Parquet file per rollout under
`<out>/<batch_id>/`); this command adds `<out>/<batch_id>/_manifest.json` with every
rollout's outcome, so a trainer (or `RolloutClient.load_samples`) can pick them up.
A local `--out` is a path on the worker hosts: use `s3://…` when workers are remote.
Ctrl-C cancels the batch (each rollout still cleans up) unless `--detach` is given.
The summary gives each rollout that did not end well with the first line of why, and
the `rollout show` command for the batch.
"""

import asyncio
import json
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rollout_client.client import Batch, RolloutClient, RolloutOutcome
from rollout_client.samples_reader import first_line
from schemas.outcome import whose_failure
from schemas.samples import is_s3
from schemas.tasks import RolloutTask
from task_formats import verifier_evidence
from task_formats.harbor import ORACLE
from workers.model_options import model_options
from workers.show_cmd import show_command
from workers.show_render import safe
from workers.task_source_cmd import TaskSourceArgs, prebuild_images, task_source_options
from workers.temporal_options import TemporalOptions


@dataclass
class BatchReport:
    """Everything the summary shows; also returned to callers (demo, tests)."""

    batch: Batch
    outcomes: list[RolloutOutcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def completed(self) -> list[RolloutOutcome]:
        return [o for o in self.outcomes if o.ok]

    @property
    def failed(self) -> list[RolloutOutcome]:
        return [o for o in self.outcomes if not o.ok]

    def mean_reward(self) -> float | None:
        rewards = [
            o.result.reward for o in self.completed if o.result and o.result.reward is not None
        ]
        return statistics.fmean(rewards) if rewards else None

    def manifest(self) -> dict[str, object]:
        return {
            "batch_id": self.batch.batch_id,
            "output": self.batch.output,
            "wall_s": round(self.wall_s, 3),
            "groups": self.batch.groups,
            "rollouts": [o.model_dump(mode="json") for o in self.outcomes],
        }


def batch_output(out: str, batch_id: str) -> str:
    if is_s3(out):
        return f"{out.rstrip('/')}/{batch_id}"
    return str((Path(out) / batch_id).resolve())


def _progress_line(report: BatchReport, total: int, started: float) -> str:
    done, failed = len(report.completed), len(report.failed)
    minutes = max((time.monotonic() - started) / 60, 1e-9)
    mean = report.mean_reward()
    return (
        f"done {done} · running {total - done - failed} · failed {failed} · "
        f"{done / minutes:.1f}/min · mean reward {'-' if mean is None else f'{mean:.3f}'}"
    )


async def run_batch(
    client: RolloutClient,
    tasks: list[RolloutTask],
    out: str,
    samples_per_task: int = 1,
    batch_id: str | None = None,
    seed: int | None = None,
    console: Console | None = None,
    rerun_failed: bool = False,
) -> BatchReport:
    """Submit and follow a batch with a live progress bar; returns the report."""
    console = console or Console()
    batch_id = batch_id or client.plan(tasks, out, 1)[0].batch_id
    output = batch_output(out, batch_id)
    started = time.monotonic()
    batch = await client.submit(
        tasks, output, samples_per_task, batch_id=batch_id, seed=seed, rerun_failed=rerun_failed
    )
    report = BatchReport(batch)
    total = len(batch.rollout_ids)
    console.print(
        f"batch [bold]{batch.batch_id}[/]: {len(tasks)} task(s) × {samples_per_task} = "
        f"{total} rollout(s) → {output}",
        soft_wrap=True,
    )
    columns = (
        TextColumn("[bold]rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(
            "rollouts", total=total, line=_progress_line(report, total, started)
        )
        async for outcome in client.results(batch):
            report.outcomes.append(outcome)
            progress.update(bar, advance=1, line=_progress_line(report, total, started))
            if not outcome.ok:
                progress.console.print(
                    Text.assemble(
                        (f"✗ {outcome.rollout_id}", "red"),
                        f" {outcome.workflow_status}: {safe(first_line(outcome.error or ''))}",
                    )
                )
    report.wall_s = time.monotonic() - started
    if not is_s3(output):
        path = Path(output)
        path.mkdir(parents=True, exist_ok=True)
        (path / "_manifest.json").write_text(json.dumps(report.manifest(), indent=2))
    return report


def summary_table(report: BatchReport) -> Table:
    table = Table(title=f"batch {report.batch.batch_id} ({report.wall_s:.1f} s)")
    for name in ("task", "rollouts", "completed", "failed", "statuses", "mean reward", "samples"):
        left = name in ("task", "statuses")
        table.add_column(name, justify="left" if left else "right", overflow="fold")
    per_task: dict[str, list[RolloutOutcome]] = defaultdict(list)
    rid_task = {
        rid: group.removeprefix(f"{report.batch.batch_id}-")
        for group, rids in report.batch.groups.items()
        for rid in rids
    }
    for outcome in report.outcomes:
        per_task[rid_task.get(outcome.rollout_id, "?")].append(outcome)
    for task_id in sorted(per_task):
        outs = per_task[task_id]
        done = [o.result for o in outs if o.result]
        rewards = [r.reward for r in done if r.reward is not None]
        statuses = Counter(str(r.status) for r in done)
        table.add_row(
            task_id,
            str(len(outs)),
            str(len(done)),
            str(len(outs) - len(done)),
            ", ".join(f"{k}={v}" for k, v in sorted(statuses.items())) or "-",
            f"{statistics.fmean(rewards):.3f}" if rewards else "-",
            str(sum(r.num_samples for r in done)),
        )
    return table


def failure_reasons(report: BatchReport) -> list[tuple[str, str, str]]:
    """(rollout, status, the first line of why) of each rollout that did not end well."""
    out: list[tuple[str, str, str]] = []
    for o in sorted(report.outcomes, key=lambda o: o.rollout_id):
        r = o.result
        status = str(r.status) if r else o.workflow_status.lower()
        if r is not None and not whose_failure(status):
            continue
        why = first_line((r.error if r else o.error) or "") or "(no reason recorded)"
        out.append((o.rollout_id, status, safe(why)))
    return out


def print_summary(console: Console, report: BatchReport) -> None:
    """The batch's table, and each failing rollout with the first line of why."""
    console.print(summary_table(report))
    failing = failure_reasons(report)
    if failing:
        table = Table(title="not ok", title_justify="left")
        for name in ("rollout", "status", "why (first line)"):
            table.add_column(name, overflow="fold")
        for rid, status, why in failing:
            table.add_row(Text(rid), Text(status, style="red"), Text(why))
        console.print(table)


def print_show_line(console: Console, report: BatchReport, artifacts: Path | None = None) -> None:
    """The `rollout show` command for the batch: a plain, unwrapped line (scripts grep
    for it)."""
    show = show_command(report.batch.batch_id, report.batch.output, artifacts)
    console.print(f"show: {show}", soft_wrap=True, highlight=False, markup=False)


def _record_evidence(
    source: TaskSourceArgs, tasks: list[RolloutTask], report: BatchReport, console: Console
) -> None:
    """An oracle run: what it showed about each task's verifier, kept for later runs."""
    results = [o.result for o in report.outcomes if o.result is not None]
    if not any(verifier_evidence.evidence_key(t) for t in tasks):
        return
    path = source.evidence_path
    try:
        recorded, dropped = verifier_evidence.record(path, tasks, results)
    except (OSError, ValueError) as exc:
        console.print(f"[red]verifier evidence not recorded[/]: {exc}", soft_wrap=True)
        raise typer.Exit(code=1) from None
    console.print(
        f"verifier evidence: {recorded} task(s) recorded, {dropped} dropped → {path}",
        highlight=False,
        soft_wrap=True,
    )


@task_source_options(
    backend="docker", backend_help="datasets: sandbox backend (docker, local, e2b)"
)
@model_options("temporal")
def run_cmd(
    tasks_file: Annotated[
        Path,
        typer.Argument(
            metavar="PATH",
            help="JSONL file (one task per line), a Harbor task directory (or a directory of "
            "them) or SWE-bench instances (--format swebench)",
        ),
    ],
    out: Annotated[str, typer.Option(help="samples dir or s3://bucket/prefix")] = "./data/samples",
    samples_per_task: Annotated[int, typer.Option(min=1, help="rollouts per task (a group)")] = 1,
    task_queue: str = "rollouts",
    batch_id: Annotated[str | None, typer.Option(help="resume/idempotent re-run")] = None,
    seed: Annotated[int | None, typer.Option(help="base seed (default: from batch id)")] = None,
    detach: Annotated[bool, typer.Option(help="on Ctrl-C leave the batch running")] = False,
    rerun_failed: Annotated[
        bool, typer.Option(help="with --batch-id: re-run its failed rollouts")
    ] = False,
    *,
    temporal: TemporalOptions,
    source: TaskSourceArgs,
) -> None:
    """Submit the tasks at PATH, show progress, print a summary table, write samples."""
    console = Console()
    tls = temporal.tls()
    tasks = prebuild_images(source.read(tasks_file, console), console)

    async def main() -> BatchReport:
        client = await RolloutClient.connect(
            temporal.temporal, temporal.namespace, task_queue, tls=tls
        )
        bid = batch_id or client.plan(tasks, out, 1)[0].batch_id
        try:
            return await run_batch(
                client, tasks, out, samples_per_task, bid, seed, console, rerun_failed
            )
        except (KeyboardInterrupt, asyncio.CancelledError):
            if not detach:
                n = await client.cancel(bid, "rollout run interrupted")
                console.print(f"[yellow]cancelled {n} running rollout(s) of {bid}[/]")
            raise

    report = asyncio.run(main())
    print_summary(console, report)
    if source.harness == ORACLE:
        _record_evidence(source, tasks, report, console)
    mean = report.mean_reward()
    console.print(
        f"completed {len(report.completed)}/{len(report.outcomes)}, "
        f"mean reward {'-' if mean is None else f'{mean:.3f}'}"
    )
    console.print(f"samples: {report.batch.output}", soft_wrap=True, highlight=False)
    print_show_line(console, report)
    if report.failed:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    typer.run(run_cmd)
