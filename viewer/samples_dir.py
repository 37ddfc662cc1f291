"""A batch's samples directory as the viewer reads it: rollouts, their rows, the manifest
`rollout run` wrote beside them, and a worker's artifacts for each rollout.

Lenient where the pages need it: a file that cannot be read is listed with its error
(the other rollouts still show), a manifest entry whose rollout left no samples is a
rollout too, and an older schema reads through `rollout_client.storage` (its upgrade).
"""

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_client.storage import read_table
from schemas.samples import SampleRow, is_s3, table_to_rows

MANIFEST = "_manifest.json"


class NotASamplesDir(ValueError):
    """The path given is not a batch's samples directory."""


@dataclass
class RolloutSummary:
    """One rollout as the batch page lists it."""

    rollout_id: str
    task_id: str = "?"
    status: str = "unknown"
    reason: str = ""
    reward: float | None = None
    segments: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    trained_tokens: int = 0
    calls: int = 0
    duration_s: float | None = None
    harness: str = ""
    has_samples: bool = False
    error: str = ""
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    """What a samples directory holds."""

    path: str
    rollouts: dict[str, RolloutSummary]
    unreadable: dict[str, str]
    manifest: dict[str, Any] | None


class SamplesDir:
    """A local directory (or S3 prefix) of `<rollout_id>.parquet` files, with an optional
    worker data dir for the artifacts; summaries are cached per file version."""

    def __init__(self, path: str, artifacts: Path | None = None) -> None:
        self.path = path if is_s3(path) else str(Path(path).resolve())
        self.artifacts = artifacts
        self._cache: dict[str, tuple[tuple[int, int], RolloutSummary | str]] = {}
        if not is_s3(path):
            _check_local(Path(self.path))

    # ---------------------------------------------------------------- the batch
    def batch(self) -> Batch:
        manifest = self._manifest()
        rollouts: dict[str, RolloutSummary] = {}
        unreadable: dict[str, str] = {}
        for name, got in self._file_summaries():
            if isinstance(got, str):
                unreadable[name] = got
            else:
                rollouts[got.rollout_id] = got
        for entry in (manifest or {}).get("rollouts", []):
            if isinstance(entry, dict) and isinstance(entry.get("rollout_id"), str):
                rid = entry["rollout_id"]
                _apply_outcome(rollouts.setdefault(rid, RolloutSummary(rid)), entry)
        return Batch(self.path, dict(sorted(rollouts.items())), unreadable, manifest)

    def rows(self, rollout_id: str) -> list[SampleRow]:
        """The rollout's rows, in segment order (sample_index, then as written)."""
        return table_to_rows(self._table_of(rollout_id))

    def _table_of(self, rollout_id: str) -> pa.Table:
        if is_s3(self.path):
            table = read_table(f"{self.path.rstrip('/')}/{rollout_id}.parquet")
        else:
            table = read_table(str(Path(self.path) / f"{rollout_id}.parquet"))
        return table.filter(pc.equal(table.column("rollout_id"), rollout_id))

    def _manifest(self) -> dict[str, Any] | None:
        if is_s3(self.path):
            return None
        path = Path(self.path) / MANIFEST
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def _file_summaries(self) -> list[tuple[str, RolloutSummary | str]]:
        if is_s3(self.path):
            table = read_table(self.path)
            return [(rid, s) for rid, s in _summaries(table).items()]
        out: list[tuple[str, RolloutSummary | str]] = []
        for file in sorted(Path(self.path).glob("*.parquet")):
            stat = file.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._cache.get(file.name)
            if cached is None or cached[0] != key:
                try:
                    got: RolloutSummary | str = next(
                        iter(_summaries(read_table(str(file))).values())
                    )
                except StopIteration:
                    got = "no rows"
                except (OSError, ValueError, pa.ArrowException) as exc:
                    got = f"{type(exc).__name__}: {exc}"
                self._cache[file.name] = cached = (key, got)
            out.append((file.name, cached[1]))
        return out

    # ---------------------------------------------------------------- artifacts
    def attempt_dir(self, rollout_id: str) -> Path | None:
        """The rollout's last attempt's artifacts directory on the worker's disk."""
        if self.artifacts is None:
            return None
        for root in (self.artifacts / "artifacts" / rollout_id, self.artifacts / rollout_id):
            attempts = sorted(
                (p for p in root.glob("attempt-*") if p.name[8:].isdigit()),
                key=lambda p: int(p.name[8:]),
            )
            if attempts:
                return attempts[-1]
        return None


def _check_local(path: Path) -> None:
    expected = (
        "expected a batch's samples directory: <rollout_id>.parquet files (and the "
        f"{MANIFEST} `rollout run` writes) in <out>/<batch_id>/"
    )
    if not path.is_dir():
        raise NotASamplesDir(f"{path}: not a directory; {expected}")
    if any(path.glob("*.parquet")) or (path / MANIFEST).is_file():
        return
    batches = sorted(p.name for p in path.iterdir() if p.is_dir() and any(p.glob("*.parquet")))
    hint = f" It holds batch directories ({', '.join(batches[:5])}): give one." if batches else ""
    raise NotASamplesDir(f"{path}: no samples found; {expected}.{hint}")


def _summaries(table: pa.Table) -> dict[str, RolloutSummary]:
    """One summary per rollout of `table` (token counts from Arrow, no row objects)."""
    cols = {
        name: table.column(name).to_pylist()
        for name in ("rollout_id", "task_id", "status", "reward", "status_reason", "harness")
    }
    prompt = pc.list_value_length(table.column("prompt_ids")).to_pylist()
    response = pc.list_value_length(table.column("response_ids")).to_pylist()
    calls = pc.list_value_length(table.column("call_policy_versions")).to_pylist()
    mask = table.column("loss_mask")
    trained = np.bincount(
        pc.list_parent_indices(mask).to_numpy(),
        weights=pc.list_flatten(mask).to_numpy(),
        minlength=table.num_rows,
    ).astype(int)
    by_rollout: dict[str, RolloutSummary] = {}
    statuses: dict[str, list[str]] = defaultdict(list)
    for i, rid in enumerate(cols["rollout_id"]):
        s = by_rollout.setdefault(
            rid,
            RolloutSummary(
                rid,
                task_id=cols["task_id"][i],
                reward=cols["reward"][i],
                harness=cols["harness"][i],
                has_samples=True,
            ),
        )
        s.segments += 1
        s.prompt_tokens += prompt[i]
        s.response_tokens += response[i]
        s.trained_tokens += int(trained[i])
        s.calls += calls[i]
        statuses[rid].append(cols["status"][i])
        s.reason = s.reason or cols["status_reason"][i]
    for rid, s in by_rollout.items():
        # the rollout's status is its worst row's (a masked row explains a masked reward)
        non_ok = [st for st in statuses[rid] if st != "ok"]
        s.status = non_ok[0] if non_ok else "ok"
    return by_rollout


def _apply_outcome(s: RolloutSummary, entry: dict[str, Any]) -> None:
    """The manifest's word on a rollout: its own status (e.g. `eval_error`, which rows
    carry as `infra_error`), reward, duration, and why a rollout has no result."""
    result = entry.get("result")
    if isinstance(result, dict):
        s.result = result
        s.task_id = str(result.get("task_id", s.task_id))
        s.status = str(result.get("status", s.status))
        if isinstance(result.get("reward"), int | float) or result.get("reward") is None:
            s.reward = result.get("reward")
        if isinstance(result.get("duration_s"), int | float):
            s.duration_s = float(result["duration_s"])
        s.reason = s.reason or str(result.get("error") or "")
        s.harness = s.harness or str(result.get("harness", ""))
    else:
        s.status = str(entry.get("workflow_status", s.status)).lower()
        s.error = str(entry.get("error") or "")
        s.reason = s.reason or s.error
