"""`rollout show ROLLOUT_ID|BATCH_ID`: why a rollout ended as it did, in the terminal.

From a samples directory (`--samples`: a batch's directory or the `--out` of `rollout
run` above several) with the worker's artifacts (`--artifacts`: a worker's data dir), or,
without `--samples`, from Temporal (the workflow's result and history). A rollout: its
status and whose doing it was, the evaluation's checks with the tail of each one's
detail, reward and metrics, seconds per step, calls with tokens and policy version, and
where its artifacts are. A batch: status counts, reward by task, the slowest rollouts,
and every error grouped by its first line.
"""

import asyncio
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rollout_client.client import RolloutClient
from rollout_client.samples_reader import (
    NotASamplesDirectoryError,
    NotFoundError,
    SamplesReader,
)
from rollout_client.temporal_connection import TemporalConnectError
from workers.model_options import model_options
from workers.show_render import batch_view, print_view, rollout_view
from workers.temporal_options import TemporalOptions


def show_command(ident: str, samples: str | None, artifacts: str | Path | None = None) -> str:
    """The command line that shows `ident` (printed by `rollout run` and `demo`)."""
    parts = ["rollout", "show", ident]
    if samples is not None:
        parts += ["--samples", str(samples)]
    if artifacts is not None:
        parts += ["--artifacts", str(artifacts)]
    return shlex.join(parts)


def show_from_samples(
    console: Console, ident: str, samples: str, artifacts: Path | None = None
) -> None:
    """Print a batch or a rollout from a samples directory (errors: see the reader)."""
    reader = SamplesReader(samples, artifacts)
    if reader.kind_of(ident) == "batch":
        view = reader.batch(ident)
        example = next((r.rollout_id for r in view.rollouts if r.whose), None)
        hint = show_command(example, samples, artifacts) if example else None
        print_view(console, batch_view(view, hint and f"a failing rollout: {hint}"))
    else:
        print_view(console, rollout_view(reader.rollout(ident)))


async def show_from_temporal(
    console: Console, client: RolloutClient, ident: str, artifacts: Path | None = None
) -> None:
    from workers.show_temporal import batch_from_temporal, rollout_from_temporal

    try:
        detail = await rollout_from_temporal(client, ident, artifacts)
    except NotFoundError:
        print_view(console, batch_view(await batch_from_temporal(client, ident)))
        return
    print_view(console, rollout_view(detail))


@model_options("temporal")
def show_cmd(
    ident: Annotated[str, typer.Argument(metavar="ROLLOUT_ID|BATCH_ID")],
    samples: Annotated[
        str | None,
        typer.Option(
            help="samples dir (a batch's, or `rollout run --out`) or s3://bucket/prefix; "
            "without it: from Temporal"
        ),
    ] = None,
    artifacts: Annotated[
        Path | None, typer.Option(help="a worker's data dir, to find the rollout's artifacts")
    ] = None,
    task_queue: str = "rollouts",
    *,
    temporal: TemporalOptions,
) -> None:
    """Show why a rollout (or each rollout of a batch) ended as it did."""
    console = Console()
    try:
        if samples is not None:
            show_from_samples(console, ident, samples, artifacts)
            return
        tls = temporal.tls()

        async def main() -> None:
            client = await RolloutClient.connect(
                temporal.temporal, temporal.namespace, task_queue, tls=tls
            )
            await show_from_temporal(console, client, ident, artifacts)

        asyncio.run(main())
    except (NotASamplesDirectoryError, TemporalConnectError) as exc:
        console.print(f"show: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except NotFoundError as exc:
        console.print(f"show: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":
    typer.run(show_cmd)
