"""Chaos bench: N rollouts through the real stack while its processes are SIGKILLed.

    python -m bench.chaos --n 200 --seed 0
    python -m bench.chaos --n 24 --faults worker,gateway --fuzz-examples 1000

The run itself (the stack, the faults, the checks) is `stress.chaos`; this prints its
report and exits 1 if any requirement failed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from stress.chaos import DEFAULT_FAULTS, ChaosConfig, Fault, render, run_chaos

app = typer.Typer(add_completion=False)


@app.command()
def main(
    n: Annotated[int, typer.Option(help="rollouts")] = 200,
    engine: Annotated[str, typer.Option(help="scripted | vllm (vLLM CPU, tiny model)")] = (
        "scripted"
    ),
    seed: int = 0,
    faults: Annotated[
        str, typer.Option(help="comma-separated, in order: worker, gateway, temporal, engine")
    ] = ",".join(DEFAULT_FAULTS),
    fuzz_examples: Annotated[int, typer.Option(help="malformed requests per protocol")] = 10_000,
    turns: int = 4,
    pause_s: float = 0.5,
    agent_retries: Annotated[int, typer.Option(help="SDK-style retries per agent call")] = 12,
    workers: int = 2,
    max_sandboxes: Annotated[int, typer.Option(help="per worker")] = 8,
    down_s: Annotated[float, typer.Option(help="seconds a killed part stays down")] = 3.0,
    heartbeat_s: Annotated[float, typer.Option(help="dead worker detection")] = 10.0,
    reaper_interval_s: float = 10.0,
    deadline_s: float = 1800.0,
    work_dir: Path | None = None,
    keep: bool = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the report")] = None,
) -> None:
    """Run N rollouts while SIGKILLing their parts; print what was lost (nothing, we hope)."""
    config = ChaosConfig(
        n=n,
        engine=engine,
        seed=seed,
        faults=[Fault(f.strip()) for f in faults.split(",") if f.strip()],
        fuzz_examples=fuzz_examples,
        turns=turns,
        pause_s=pause_s,
        agent_retries=agent_retries,
        workers=workers,
        max_sandboxes=max_sandboxes,
        down_s=down_s,
        heartbeat_s=heartbeat_s,
        reaper_interval_s=reaper_interval_s,
        deadline_s=deadline_s,
        work_dir=work_dir,
        keep=keep,
    )
    console = Console()
    report = asyncio.run(run_chaos(config, Console(stderr=True)))
    render(report, console)
    if json_out:
        json_out.write_text(report.model_dump_json(indent=2))
    problems = report.problems()
    for problem in problems:
        console.print(f"[red]FAIL[/red] {problem}")
    raise typer.Exit(1 if problems else 0)


if __name__ == "__main__":
    app()
