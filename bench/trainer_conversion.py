"""Conversion of our sample rows to each trainer's batch: rows/s and peak memory.

`--rollouts` rollouts (default 10,000) of `--calls` LLM calls each (default 8), in GRPO
groups of `--group-size`, go through the trainer-neutral conversion layer
(`bridges.rollouts.to_training_rollouts`) and then through every bridge's
`convert_batch` (`bridges.<trainer>` for trl, verl, skyrl, slime, openrlhf), one batch
of `--batch-rollouts` rollouts at a time — as a trainer meets them, and as
`bridges.groups.GroupBatcher` hands them out (one batch of rows in memory).

The rows are synthetic but shaped like an agent's: each one a `SampleRow` (schema
checked), a `--prompt-tokens` first prompt, then per call `--sampled` policy tokens
(mask 1, with logprobs) followed by `--env-tokens` tool/environment tokens (mask 0),
per-call versions, starts and sampling settings; they go through the Arrow table and
`to_pylist()`, the dicts a bridge gets from `RolloutClient.load_samples(...).to_pylist()`.
Building them is not timed.

Printed per trainer: whether its bridge module is present, which path it took —
`package imports` when its trainer's package imports in this interpreter (the bridge
then builds the trainer's own classes where it has any), else `documented fields` (the
bridge's field shapes without the package); `needs <package>` when the bridge cannot be
imported without its trainer here — the bridge's rows/s alone and together with the conversion
layer (rows = rollouts: one row per rollout here), and its peak memory.

- rows/s: rows over *thread CPU time* (`time.thread_time`), summed over all batches, so
  other jobs on a shared machine inflate it less than wall time would.
- `--trainer-envs`: each bridge whose trainer declares an overlay
  (`environments.trainer.TRAINER_EXTRAS`) is measured in a child process on that
  overlay's interpreter, where its trainer's package imports (path `package imports
  (trainer env)`); the others, and the conversion layer, in this interpreter.
- peak memory: `tracemalloc`'s peak of Python allocations while converting one batch,
  above what was allocated before (the input rows and, for a bridge, the converted
  batch it reads are excluded: they exist already). A separate pass, since tracing
  slows Python down. The process's peak RSS (`ru_maxrss`, everything incl. the input)
  is printed once at the end.

Run: `python -m bench.trainer_conversion [--rollouts 10000] [--calls 8] [--trainer-envs]`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridges.rollouts import ConversionRules, ConvertedBatch, to_training_rollouts
from schemas.outcome import RolloutStatus
from schemas.samples import SampleRow, rows_to_table
from schemas.scenes import Scene

TRAINERS = ("trl", "verl", "skyrl", "slime", "openrlhf")
#: The module whose import says a trainer's own classes are there (not a PyPI namesake).
TRAINER_MODULES = {
    "trl": "trl",
    "verl": "verl.experimental.agent_loop",
    "skyrl": "skyrl.train.generators.base",
    "slime": "slime.utils.types",
    "openrlhf": "openrlhf",
}
VERSION = "bench-v3"
SAMPLING = '{"temperature": 1.0, "top_p": 1.0, "max_tokens": 512}'
"""A session's sampling settings as the Gateway records them, on every call of a row."""
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Shape:
    rollouts: int
    calls: int
    group_size: int
    batch_rollouts: int
    prompt_tokens: int
    sampled: int
    env_tokens: int
    seed: int


def make_rows(shape: Shape, first: int, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """`count` rollouts' rows, from rollout index `first`, as Parquet-read dicts."""
    rows: list[SampleRow] = []
    per_call = shape.sampled + shape.env_tokens
    for index in range(first, first + count):
        group = index // shape.group_size
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        starts: list[int] = []
        for _ in range(shape.calls):
            starts.append(len(response))
            response += [rng.randrange(3, 150_000) for _ in range(shape.sampled)]
            mask += [1] * shape.sampled
            logprobs += [-rng.random() * 2 for _ in range(shape.sampled)]
            response += [rng.randrange(3, 150_000) for _ in range(shape.env_tokens)]
            mask += [0] * shape.env_tokens
            logprobs += [0.0] * shape.env_tokens
        assert len(response) == per_call * shape.calls
        rows.append(
            SampleRow(
                rollout_id=f"bench-t{group}-{index % shape.group_size}",
                task_id=f"t{group}",
                group_id=f"bench-t{group}",
                sample_index=index % shape.group_size,
                segment_id=f"s{index}",
                scene=Scene.main,
                prompt_ids=[rng.randrange(3, 150_000) for _ in range(shape.prompt_tokens)],
                response_ids=response,
                loss_mask=mask,
                logprobs=logprobs,
                reward=float(rng.random() < 0.5),
                status=RolloutStatus.ok,
                policy_version=VERSION,
                call_policy_versions=[VERSION] * shape.calls,
                call_starts=starts,
                env_version="env",
                prompt_template_version="tmpl",
                reward_fn_version="rf",
                harness="command",
                harness_version="1",
                sampling=SAMPLING,
                call_sampling=[SAMPLING] * shape.calls,
                seed=index,
            )
        )
    return rows_to_table(rows).to_pylist()


def batches(shape: Shape) -> Iterator[list[dict[str, Any]]]:
    rng = random.Random(shape.seed)
    for first in range(0, shape.rollouts, shape.batch_rollouts):
        yield make_rows(shape, first, min(shape.batch_rollouts, shape.rollouts - first), rng)


@dataclass
class Bridge:
    name: str
    convert: Callable[[ConvertedBatch], Any] | None
    path: str
    cpu_s: float = 0.0
    peak_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def load_bridge(name: str) -> Bridge:
    if name == "skyrl" and sys.version_info < (3, 12):
        # SkyRL 0.3.0 needs 3.12's TypedDict in its pydantic models; on 3.11 the tests
        # and this bench swap in typing_extensions' (docs/trainers/skyrl.md)
        import typing

        import typing_extensions

        typing.TypedDict = typing_extensions.TypedDict  # type: ignore[assignment]
    try:
        module = importlib.import_module(f"bridges.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"bridges.{name}":
            return Bridge(name, None, "not present")
        # the bridge imports its trainer unconditionally: it has no documented-field path
        return Bridge(name, None, f"needs {exc.name}")
    except Exception as exc:  # its trainer's import broke in another way: say how
        return Bridge(name, None, f"import failed: {type(exc).__name__}")
    try:
        own = importlib.util.find_spec(TRAINER_MODULES[name]) is not None
    except Exception:  # a parent package that fails to import: not importable here
        own = False
    path = "package imports" if own else "documented fields"
    return Bridge(name, module.convert_batch, path)


def traced_peak(run: Callable[[], Any]) -> int:
    """Peak bytes Python allocated while `run` ran, above what was allocated before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = run()
        peak = tracemalloc.get_traced_memory()[1] - base
        del result
    finally:
        tracemalloc.stop()
    return peak


def measure(shape: Shape, names: list[str]) -> dict[str, Any]:
    """Time and trace the layer and each named bridge over every batch of `shape`."""
    rules = ConversionRules(current_version=3, max_staleness=1)
    bridges = [load_bridge(n) for n in names]
    live = [b for b in bridges if b.convert is not None]
    rows_total = 0
    layer_cpu = 0.0
    layer_peak = 0
    for number, rows in enumerate(batches(shape)):
        rows_total += len(rows)
        t0 = time.thread_time()
        converted = to_training_rollouts(rows, rules)
        layer_cpu += time.thread_time() - t0
        for bridge in live:
            assert bridge.convert is not None
            t0 = time.thread_time()
            out = bridge.convert(converted)
            bridge.cpu_s += time.thread_time() - t0
            del out
        if number == 0:  # the memory pass, on the first batch
            layer_peak = traced_peak(lambda rows=rows: to_training_rollouts(rows, rules))
            for bridge in live:
                convert = bridge.convert
                assert convert is not None
                bridge.peak_bytes = traced_peak(lambda c=convert, b=converted: c(b))
        del converted, rows
    return {
        "rows": rows_total,
        "layer_cpu_s": layer_cpu,
        "layer_peak_bytes": layer_peak,
        "bridges": [
            {"name": b.name, "path": b.path, "cpu_s": b.cpu_s, "peak_bytes": b.peak_bytes}
            for b in bridges
        ],
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def in_trainer_env(name: str, argv: list[str]) -> dict[str, Any] | None:
    """The bridge measured in its trainer's overlay (`environments.trainer`, built on
    first use), where the trainer's own classes import; None: no overlay declared."""
    from environments.trainer import TRAINER_EXTRAS, trainer_environment, trainer_python

    extras = TRAINER_EXTRAS.get(name)
    if extras is None:
        return None
    python = trainer_python(extras=extras)
    proc = subprocess.run(
        [str(python), "-m", "bench.trainer_conversion", *argv, "--trainers", name, "--json"],
        capture_output=True,
        text=True,
        env=trainer_environment(REPO),
        cwd=REPO,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} in its trainer env failed:\n{proc.stderr[-3000:]}")
    [bridge] = json.loads(proc.stdout.strip().splitlines()[-1])["bridges"]
    bridge["path"] += " (trainer env)"
    return dict(bridge)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-rollouts", type=int, default=256, help="rollouts per batch")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--sampled", type=int, default=160, help="policy tokens per call")
    parser.add_argument("--env-tokens", type=int, default=240, help="tool tokens after a call")
    parser.add_argument("--trainers", default=",".join(TRAINERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trainer-envs",
        action="store_true",
        help="measure each bridge in its trainer's overlay (TRAINER_EXTRAS), where its "
        "trainer's own classes import; builds a missing overlay (minutes, once)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    shape = Shape(
        args.rollouts,
        args.calls,
        args.group_size,
        args.batch_rollouts,
        args.prompt_tokens,
        args.sampled,
        args.env_tokens,
        args.seed,
    )
    names = [n for n in args.trainers.split(",") if n]
    own_env: dict[str, dict[str, Any]] = {}
    if args.trainer_envs:
        argv = [
            f"--rollouts={shape.rollouts}",
            f"--calls={shape.calls}",
            f"--group-size={shape.group_size}",
            f"--batch-rollouts={shape.batch_rollouts}",
            f"--prompt-tokens={shape.prompt_tokens}",
            f"--sampled={shape.sampled}",
            f"--env-tokens={shape.env_tokens}",
            f"--seed={shape.seed}",
        ]
        for name in names:
            if load_bridge(name).path == "not present":
                continue
            found = in_trainer_env(name, argv)
            if found is not None:
                own_env[name] = found
    figures = measure(shape, [n for n in names if n not in own_env])
    by_name = {b["name"]: b for b in figures["bridges"]} | own_env
    figures["bridges"] = [by_name[n] for n in names]
    if args.json:
        print(json.dumps(figures))
        return
    report(shape, figures)


def report(shape: Shape, figures: dict[str, Any]) -> None:
    mib = 1024 * 1024
    rows, layer_cpu = figures["rows"], figures["layer_cpu_s"]
    tokens = shape.prompt_tokens + shape.calls * (shape.sampled + shape.env_tokens)
    print(
        f"{rows} rollouts x {shape.calls} calls ({tokens} tokens each: "
        f"{shape.prompt_tokens} prompt + {shape.calls} x ({shape.sampled} sampled + "
        f"{shape.env_tokens} tool)), groups of {shape.group_size}, batches of "
        f"{shape.batch_rollouts}; rows/s over thread CPU time; peak = tracemalloc peak "
        "while converting one batch"
    )
    head = f"{'stage':<24} {'path':<30} {'rows/s alone':>13} {'rows/s w/ layer':>16}"
    print(f"{head} {'peak MiB':>9}")
    print(
        f"{'to_training_rollouts':<24} {'pure Python':<30} {rows / layer_cpu:>13,.0f} "
        f"{'':>16} {figures['layer_peak_bytes'] / mib:>9.1f}"
    )
    for bridge in figures["bridges"]:
        label = f"bridges.{bridge['name']}"
        if not bridge["cpu_s"]:
            print(f"{label:<24} {bridge['path']:<30}")
            continue
        alone = rows / bridge["cpu_s"]
        both = rows / (bridge["cpu_s"] + layer_cpu)
        print(
            f"{label:<24} {bridge['path']:<30} {alone:>13,.0f} {both:>16,.0f} "
            f"{bridge['peak_bytes'] / mib:>9.1f}"
        )
    print(f"process peak RSS (everything, incl. building the input): {figures['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
