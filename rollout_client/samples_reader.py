"""A samples directory read for people: a batch's rollouts, and one rollout in full.

`rollout show` and the web viewer both read through this module, so they say the same
thing about a rollout. It opens what `rollout run` writes (`<out>/<batch_id>/` with one
`<rollout_id>.parquet` per rollout and `_manifest.json`), on a local disk or under
`s3://bucket/prefix`, either the batch's directory or the `--out` above it. Every file's
schema is checked (`rollout_client.storage`); an older file opens and says which of the
fields it does not record (`RolloutDetail.missing`); a file that cannot be read is named
in `BatchView.unreadable` and the rest still shows. With a worker's data dir
(`artifacts=`), a rollout's artifacts are looked up there, and one not found is reported
as missing.
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from rollout_client.storage import read_table, s3_client
from schemas.conversation import CallConversation, conversation_of
from schemas.outcome import RolloutStatus, whose_failure
from schemas.samples import (
    KNOWN_SCHEMA_VERSIONS,
    ArtifactRow,
    CheckRow,
    SampleRow,
    check_schema,
    is_s3,
    labels_of,
    metrics_of,
    schema_of,
    table_to_rows,
    upgrade,
)

MANIFEST = "_manifest.json"
#: What a rollout's summary is made of: a batch reads only these (and what `upgrade`
#: fills an older file's from), never the token lists but the two it counts.
_COUNTED = ("prompt_ids", "loss_mask")
_SUMMARY_COLUMNS = (
    "rollout_id",
    "batch_id",
    "task_id",
    "group_id",
    "sample_index",
    "status",
    "rollout_status",
    "status_reason",
    "verdict",
    "reward",
    "reward_metrics",
    "step_durations",
    "harness",
    "harness_version",
    "policy_version",
    "call_policy_versions",
    "schema_version",
    *_COUNTED,
)
#: What `upgrade` reads, or looks for to tell an older file.
_UPGRADE_INPUTS = ("sampling", "env_version", "call_sampling", "task_source")
VERSION_KEY = b"agentic_rollout.schema_version"
#: What each schema version added that a person reading a rollout would miss.
_RECORDED_SINCE = {
    "task source and image digest": 4,
    "status reason": 5,
    "verdict sources": 5,
    "rollout status": 6,
    "evaluation checks": 6,
    "step durations": 6,
    "artifacts": 6,
    "conversation": 7,
    "routed experts": 8,
}
#: The steps of a rollout in the order they run (others follow, as recorded).
STEP_ORDER = (
    "provision",
    "setup",
    "before_run",
    "agent",
    "stop_agent",
    "after_run",
    "evaluate",
    "collect",
)
#: When the rollout status is not recorded, the row status that says most about it.
_WORST_FIRST = (
    RolloutStatus.infra_error,
    RolloutStatus.agent_broke_sandbox,
    RolloutStatus.agent_timeout,
    RolloutStatus.truncated,
    RolloutStatus.ok,
)


class NotASamplesDirectoryError(ValueError):
    """The path holds no samples written by `rollout run` (nor directories of them)."""


class NotFoundError(LookupError):
    """No batch or rollout of that id under the samples directory."""


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckView(CheckRow):
    """One evaluation check: verdict, score, exit code, time, and the tail of its detail."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: What its verdict was read from (reward.txt, junit-xml, …), when it reads one.
    source: str | None = None


class CallView(_View):
    """One engine call of a segment: the version that sampled it, its tokens, and what
    its protocol carried (None: not recorded, an older file or gateway)."""

    index: int
    policy_version: str
    #: Where its sampled tokens begin and end in the segment's `response_ids`.
    start: int
    end: int
    trained_tokens: int
    sampling: str
    conversation: CallConversation | None = None

    @property
    def tokens(self) -> int:
        return self.end - self.start


class SegmentView(_View):
    """One sample row: a segment's tokens, its loss mask and logprobs, and its calls."""

    segment_id: str
    parent_segment_id: str | None
    link: str | None
    scene: str
    status: str
    reward: float
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    #: The policy version that sampled each response token.
    token_versions: list[str]
    calls: list[CallView]

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


class ArtifactView(_View):
    """A file the run kept. `state`: `present` (found at `path`), `missing` (looked for
    and not found), `remote` (uploaded: `location` is its URI), `not looked` (no
    worker data dir given)."""

    name: str
    kind: str
    location: str
    size: int = 0
    path: str | None = None
    state: Literal["present", "missing", "remote", "not looked"]


class RolloutSummary(_View):
    """What a batch page or table says about one rollout."""

    rollout_id: str
    batch_id: str
    task_id: str
    group_id: str = ""
    sample_index: int = 0
    #: The rollout's status (`RolloutStatus`), or the workflow's when it has no result.
    status: str
    #: False: the file predates the rollout status; `status` is read from its rows.
    status_recorded: bool = True
    #: Whose doing the status is: "" (ended well), agent, evaluator, infrastructure.
    whose: str
    reason: str = ""
    verdict: str = ""
    reward: float | None = None
    reward_metrics: dict[str, float] = Field(default_factory=dict)
    step_durations: dict[str, float] = Field(default_factory=dict)
    #: The whole rollout, start to result (from the batch's manifest, when it has one).
    duration_s: float | None = None
    harness: str = ""
    harness_version: str = ""
    policy_versions: list[str] = Field(default_factory=list)
    segments: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    trained_tokens: int = 0
    #: The samples' schema version (None: no samples, known from the manifest only).
    schema_version: int | None = None
    #: Where its samples are (None: it wrote none).
    samples_uri: str | None = None

    @property
    def reason_line(self) -> str:
        """The reason's first non-empty line (how errors are grouped)."""
        return first_line(self.reason)


class RolloutDetail(RolloutSummary):
    """One rollout in full: checks, segments with calls, lineage and artifacts."""

    checks: list[CheckView] = Field(default_factory=list)
    segment_views: list[SegmentView] = Field(default_factory=list)
    artifacts: list[ArtifactView] = Field(default_factory=list)
    #: The run's artifacts directory on the worker, as recorded.
    artifacts_dir: str = ""
    env_version: str = ""
    task_source: str = ""
    image_digest: str = ""
    reward_fn_version: str = ""
    prompt_template_version: str = ""
    sandbox_facts: dict[str, str] = Field(default_factory=dict)
    #: What this rollout's files do not record (written by an older schema).
    missing: list[str] = Field(default_factory=list)


class BatchView(_View):
    """A batch: its rollouts, and the files that could not be read."""

    batch_id: str
    location: str
    rollouts: list[RolloutSummary]
    #: file → why it could not be read (the other files still show).
    unreadable: dict[str, str] = Field(default_factory=dict)
    schema_versions: list[int] = Field(default_factory=list)

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.rollouts).most_common())

    def rewards_by_task(self) -> dict[str, list[float]]:
        """Each task's rewards (rollouts with no reward left out)."""
        out: dict[str, list[float]] = defaultdict(list)
        for r in self.rollouts:
            if r.reward is not None:
                out[r.task_id].append(r.reward)
        return dict(sorted(out.items()))

    def slowest(self, n: int = 5) -> list[RolloutSummary]:
        timed = [r for r in self.rollouts if _duration(r) is not None]
        return sorted(timed, key=lambda r: _duration(r) or 0.0, reverse=True)[:n]

    def errors(self) -> dict[str, list[RolloutSummary]]:
        """Every failing rollout, grouped by its reason's first line (most common first)."""
        groups: dict[str, list[RolloutSummary]] = defaultdict(list)
        for r in self.rollouts:
            if r.whose:
                groups[r.reason_line or f"({r.status}, no reason recorded)"].append(r)
        return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


def first_line(text: str) -> str:
    """The first non-empty line of `text`, stripped ("" when there is none)."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _duration(r: RolloutSummary) -> float | None:
    if r.duration_s is not None:
        return r.duration_s
    return sum(r.step_durations.values()) if r.step_durations else None


class SamplesReader:
    """Opens a samples directory (a batch's, or `rollout run --out` above several);
    refuses a path that is neither, saying what was expected."""

    def __init__(self, path: str | Path, artifacts: str | Path | None = None) -> None:
        self.location = str(path).rstrip("/") if is_s3(str(path)) else str(Path(path))
        self.artifacts = Path(artifacts) if artifacts is not None else None
        self._store = _S3Dir() if is_s3(self.location) else _LocalDir()
        if self._store.parquet_files(self.location) or self._store.has(self.location, MANIFEST):
            self._batch_dirs = [self.location]
        else:
            self._batch_dirs = [
                d
                for d in self._store.subdirs(self.location)
                if self._store.parquet_files(d) or self._store.has(d, MANIFEST)
            ]
        if not self._batch_dirs:
            raise NotASamplesDirectoryError(
                f"{self.location}: not a samples directory: expected <rollout_id>.parquet "
                f"sample files and {MANIFEST} (a batch's directory, <out>/<batch_id>/) or "
                f"directories of them (the --out of `rollout run`); "
                f"found {self._store.describe(self.location)}"
            )

    # ----------------------------------------------------------------- batches
    def batch_ids(self) -> list[str]:
        return [_basename(d) for d in self._batch_dirs]

    def batch(self, batch_id: str | None = None) -> BatchView:
        """A batch by id (None: the only one; refused when there are several)."""
        directory = self._batch_dir(batch_id)
        tables, unreadable = self._read_dir(directory)
        manifest = self._manifest(directory)
        rollouts: list[RolloutSummary] = []
        versions: set[int] = set()
        for table in tables:
            for rid, rows in _by_rollout(table).items():
                uri = self._store.join(directory, f"{rid}.parquet")
                summary = _summary(rid, rows, manifest.pop(rid, None), uri)
                versions.add(summary.schema_version or 0)
                rollouts.append(summary)
        rollouts += [_summary_from_manifest(rid, entry) for rid, entry in manifest.items()]
        rollouts.sort(key=lambda r: r.rollout_id)
        return BatchView(
            batch_id=_basename(directory),
            location=directory,
            rollouts=rollouts,
            unreadable=unreadable,
            schema_versions=sorted(versions - {0}),
        )

    def _batch_dir(self, batch_id: str | None) -> str:
        if batch_id is None:
            if len(self._batch_dirs) > 1:
                raise NotFoundError(
                    f"{self.location} holds {len(self._batch_dirs)} batches; name one of "
                    f"{self.batch_ids()}"
                )
            return self._batch_dirs[0]
        for d in self._batch_dirs:
            if _basename(d) == batch_id:
                return d
        raise NotFoundError(
            f"no batch {batch_id!r} under {self.location} (batches: {self.batch_ids()})"
        )

    # ----------------------------------------------------------------- rollouts
    def kind_of(self, ident: str) -> Literal["batch", "rollout"]:
        """Whether `ident` names a batch or a rollout here (NotFoundError: neither)."""
        if ident in self.batch_ids():
            return "batch"
        self._rollout_place(ident)
        return "rollout"

    def rollout(self, rollout_id: str) -> RolloutDetail:
        """One rollout in full (NotFoundError when no batch here holds it)."""
        directory, uri = self._rollout_place(rollout_id)
        entry = self._manifest(directory).get(rollout_id)
        if uri is None:
            return RolloutDetail(**_summary_from_manifest(rollout_id, entry or {}).model_dump())
        return self._detail(rollout_id, read_table(uri), uri, entry)

    def rows(self, rollout_id: str) -> list[SampleRow]:
        """A rollout's sample rows as written (every token list; for the viewer)."""
        _, uri = self._rollout_place(rollout_id)
        return table_to_rows(read_table(uri)) if uri else []

    def _rollout_place(self, rollout_id: str) -> tuple[str, str | None]:
        name = f"{rollout_id}.parquet"
        for d in self._batch_dirs:
            if self._store.has(d, name):
                return d, self._store.join(d, name)
        for d in self._batch_dirs:
            if rollout_id in self._manifest(d):
                return d, None
        raise NotFoundError(
            f"no rollout or batch {rollout_id!r} under {self.location} "
            f"(batches: {self.batch_ids()})"
        )

    def _detail(
        self, rid: str, table: pa.Table, uri: str, entry: dict[str, Any] | None
    ) -> RolloutDetail:
        summary = _summary(rid, _by_rollout(table)[rid], entry, uri)
        rows = table_to_rows(table)
        first = rows[0]
        sources = labels_of(first.verdict_sources, "verdict_sources")
        version = first.schema_version
        return RolloutDetail(
            **summary.model_dump(),
            checks=[
                CheckView(**c.model_dump(), source=sources.get(c.name)) for c in first.eval_checks
            ],
            segment_views=[_segment(r) for r in rows],
            artifacts=[artifact_view(rid, a, self.artifacts) for a in first.artifacts],
            artifacts_dir=first.artifacts_dir,
            env_version=first.env_version,
            task_source=first.task_source,
            image_digest=first.image_digest,
            reward_fn_version=first.reward_fn_version,
            prompt_template_version=first.prompt_template_version,
            sandbox_facts=labels_of(first.sandbox_facts, "sandbox_facts"),
            missing=[what for what, since in _RECORDED_SINCE.items() if version < since],
        )

    # ----------------------------------------------------------------- files
    def _read_dir(self, directory: str) -> tuple[list[pa.Table], dict[str, str]]:
        """The batch's rows without the token lists a summary does not need; a file that
        cannot be read is named with why (the rest still read)."""
        files = self._store.parquet_files(directory)
        if is_s3(directory):
            return _read_each(files, read_table)
        by_version: dict[int, list[str]] = defaultdict(list)
        unreadable: dict[str, str] = {}
        for path in files:
            try:
                schema = pq.read_schema(path)
                check_schema(schema, path)
            except (OSError, ValueError, pa.ArrowException) as exc:
                unreadable[path] = str(exc)
                continue
            by_version[int(schema.metadata[VERSION_KEY])].append(path)
        tables: list[pa.Table] = []
        for version, paths in by_version.items():
            present = schema_of(version).names
            columns = [n for n in (*_SUMMARY_COLUMNS, *_UPGRADE_INPUTS) if n in present]
            try:
                tables.append(_light(pq.ParquetDataset(paths).read(columns=columns), directory))
            except (OSError, ValueError, pa.ArrowException):  # one bad file: read them one by one
                read = lambda p, c=columns: _light(pq.read_table(p, columns=c), p)  # noqa: E731
                more, bad = _read_each(paths, read)
                tables += more
                unreadable.update(bad)
        return tables, unreadable

    def _manifest(self, directory: str) -> dict[str, dict[str, Any]]:
        """The manifest's rollouts by id ({} when there is none or it cannot be read)."""
        text = self._store.read_text(directory, MANIFEST)
        try:
            rollouts = json.loads(text)["rollouts"] if text else []
            return {str(r["rollout_id"]): r for r in rollouts}
        except (ValueError, KeyError, TypeError):
            return {}


# --------------------------------------------------------------------- row → views


def _read_each(
    paths: list[str], read: Callable[[str], pa.Table]
) -> tuple[list[pa.Table], dict[str, str]]:
    tables: list[pa.Table] = []
    unreadable: dict[str, str] = {}
    for path in paths:
        try:
            tables.append(read(path))
        except (OSError, ValueError, pa.ArrowException) as exc:
            unreadable[path] = str(exc)
    return tables, unreadable


def _light(table: pa.Table, source: str) -> pa.Table:
    """A table of the summary's columns, an older one's brought up to date."""
    table = upgrade(table)
    unknown = set(table.column("schema_version").to_pylist()) - KNOWN_SCHEMA_VERSIONS
    if unknown:
        raise ValueError(f"{source}: rows with schema_version {sorted(unknown)}")
    return table.select(list(_SUMMARY_COLUMNS))


def _by_rollout(table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    """Each rollout's rows (the summary's columns) with their token counts instead of
    the token lists."""
    counts = {
        "prompt_tokens": pc.list_value_length(table.column("prompt_ids")).to_pylist(),
        "response_tokens": pc.list_value_length(table.column("loss_mask")).to_pylist(),
        "trained_tokens": _list_sums(table.column("loss_mask")),
        "calls": pc.list_value_length(table.column("call_policy_versions")).to_pylist(),
    }
    light = table.select([n for n in _SUMMARY_COLUMNS if n not in _COUNTED])
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i, row in enumerate(light.to_pylist()):
        row.update({name: values[i] or 0 for name, values in counts.items()})
        out[row["rollout_id"]].append(row)
    return out


def _list_sums(column: pa.ChunkedArray) -> list[int]:
    """The sum of each row's list, without a Python loop over the tokens."""
    column = column.combine_chunks()
    sums = [0] * len(column)
    flat = pc.list_flatten(column)
    if len(flat):
        parents = pc.list_parent_indices(column)
        grouped = pa.table({"p": parents, "v": pc.cast(flat, pa.int64())}).group_by("p")
        for p, v in zip(*grouped.aggregate([("v", "sum")]).to_pydict().values(), strict=True):
            sums[p] = v
    return sums


def _summary(
    rid: str, rows: list[dict[str, Any]], entry: dict[str, Any] | None, uri: str
) -> RolloutSummary:
    first = rows[0]
    result = (entry or {}).get("result") or {}
    recorded = bool(first["rollout_status"])
    status = first["rollout_status"] or result.get("status") or _status_from_rows(rows)
    kept = [r["reward"] for r in rows if r["status"] != RolloutStatus.infra_error]
    reward: float | None = max(kept) if kept else None
    if status in (RolloutStatus.eval_error, RolloutStatus.infra_error):
        reward = None
    versions = list(
        dict.fromkeys(v for r in rows for v in r["call_policy_versions"] or [r["policy_version"]])
    )
    return RolloutSummary(
        rollout_id=rid,
        batch_id=first["batch_id"] or result.get("batch_id", ""),
        task_id=first["task_id"],
        group_id=first["group_id"],
        sample_index=first["sample_index"],
        status=status,
        status_recorded=recorded or bool(result),
        whose=whose_failure(status),
        reason=first["status_reason"] or result.get("error") or "",
        verdict=first["verdict"] or result.get("verdict") or "",
        reward=reward,
        reward_metrics=metrics_of(first["reward_metrics"]),
        step_durations=in_step_order(metrics_of(first["step_durations"], "step_durations")),
        duration_s=result.get("duration_s"),
        harness=first["harness"],
        harness_version=first["harness_version"],
        policy_versions=versions,
        segments=len(rows),
        calls=sum(r["calls"] for r in rows),
        prompt_tokens=sum(r["prompt_tokens"] for r in rows),
        response_tokens=sum(r["response_tokens"] for r in rows),
        trained_tokens=sum(r["trained_tokens"] for r in rows),
        schema_version=first["schema_version"],
        samples_uri=uri,
    )


def in_step_order(steps: dict[str, float]) -> dict[str, float]:
    """`steps` in the order they run (`STEP_ORDER`), any others after them."""
    rank = {name: i for i, name in enumerate(STEP_ORDER)}
    return dict(sorted(steps.items(), key=lambda kv: rank.get(kv[0], len(rank))))


def _status_from_rows(rows: Iterable[dict[str, Any]]) -> str:
    statuses = {r["status"] for r in rows}
    return next((str(s) for s in _WORST_FIRST if s in statuses), RolloutStatus.ok)


def _summary_from_manifest(rid: str, entry: dict[str, Any]) -> RolloutSummary:
    """A rollout the batch's manifest knows but that wrote no samples."""
    result = entry.get("result") or {}
    status = result.get("status") or entry.get("workflow_status") or "unknown"
    return RolloutSummary(
        rollout_id=rid,
        batch_id=result.get("batch_id", ""),
        task_id=result.get("task_id", ""),
        group_id=result.get("group_id", ""),
        sample_index=result.get("sample_index", 0),
        status=status,
        whose=whose_failure(status) if status in set(RolloutStatus) else "infrastructure",
        reason=result.get("error") or entry.get("error") or "",
        verdict=result.get("verdict") or "",
        reward=result.get("reward"),
        reward_metrics=result.get("reward_metrics") or {},
        duration_s=result.get("duration_s"),
        harness=result.get("harness", ""),
        harness_version=result.get("harness_version", ""),
    )


def _segment(row: SampleRow) -> SegmentView:
    n = len(row.response_ids)
    starts = row.call_starts or [0]
    versions = row.call_policy_versions or [row.policy_version]
    sampling = row.call_sampling or [row.sampling] * len(versions)
    said = conversation_of(row.conversation) or [None] * len(versions)
    calls = []
    for i, (version, start) in enumerate(zip(versions, starts, strict=True)):
        end = starts[i + 1] if i + 1 < len(starts) else n
        calls.append(
            CallView(
                index=i,
                policy_version=version,
                start=start,
                end=end,
                trained_tokens=sum(row.loss_mask[start:end]),
                sampling=sampling[i],
                conversation=said[i],
            )
        )
    return SegmentView(
        segment_id=row.segment_id,
        parent_segment_id=row.parent_segment_id,
        link=row.link,
        scene=str(row.scene),
        status=str(row.status),
        reward=row.reward,
        prompt_ids=row.prompt_ids,
        response_ids=row.response_ids,
        loss_mask=row.loss_mask,
        logprobs=row.logprobs,
        token_versions=row.token_policy_versions(),
        calls=calls,
    )


def artifact_view(rollout_id: str, artifact: ArtifactRow, data_dir: Path | None) -> ArtifactView:
    """Where a recorded artifact is now: uploaded (its URI), or looked up in a worker's
    data dir (`data_dir`; None: not looked)."""
    fields = artifact.model_dump()
    if "://" in artifact.location:
        return ArtifactView(**fields, state="remote")
    if data_dir is None:
        return ArtifactView(**fields, state="not looked")
    path = _local_artifact(rollout_id, artifact.location, data_dir)
    return ArtifactView(**fields, path=str(path), state="present" if path.is_file() else "missing")


def _local_artifact(rid: str, location: str, data_dir: Path) -> Path:
    """A worker's file under the data dir given: the part of its recorded path after
    `<rollout_id>/`, under `<data dir>/artifacts/<rollout_id>/` (or `<dir>/<rollout_id>/`
    when the dir given is the artifacts root itself)."""
    parts = Path(location).parts
    tail = Path(*parts[parts.index(rid) + 1 :]) if rid in parts else Path(Path(location).name)
    if ".." in tail.parts:  # never looked up outside the data dir
        return data_dir / "artifacts" / rid / tail.name
    for root in (data_dir / "artifacts", data_dir):
        candidate = root / rid / tail
        if candidate.is_file():
            return candidate
    return data_dir / "artifacts" / rid / tail


def _basename(location: str) -> str:
    return posixpath.basename(location.rstrip("/"))


# --------------------------------------------------------------------- where files are


class _LocalDir:
    """A samples directory on this machine's disk."""

    def parquet_files(self, d: str) -> list[str]:
        p = Path(d)
        return sorted(str(f) for f in p.glob("*.parquet")) if p.is_dir() else []

    def subdirs(self, d: str) -> list[str]:
        p = Path(d)
        return sorted(str(s) for s in p.iterdir() if s.is_dir()) if p.is_dir() else []

    def has(self, d: str, name: str) -> bool:
        return (Path(d) / name).is_file()

    def join(self, d: str, name: str) -> str:
        return str(Path(d) / name)

    def read_text(self, d: str, name: str) -> str | None:
        try:
            return (Path(d) / name).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def describe(self, d: str) -> str:
        p = Path(d)
        if not p.exists():
            return "nothing there"
        if not p.is_dir():
            return "a file"
        names = sorted(s.name for s in p.iterdir())
        return f"{len(names)} entries ({', '.join(names[:5])}{', …' if len(names) > 5 else ''})"


class _S3Dir:
    """A samples prefix on S3 (`s3://bucket/prefix`), listed one level at a time."""

    @staticmethod
    def _split(d: str) -> tuple[str, str]:
        bucket, _, key = d.removeprefix("s3://").partition("/")
        return bucket, (key.rstrip("/") + "/") if key else ""

    def _list(self, d: str) -> tuple[list[str], list[str]]:
        bucket, prefix = self._split(d)
        keys: list[str] = []
        dirs: list[str] = []
        pages = s3_client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            keys += [o["Key"] for o in page.get("Contents", [])]
            dirs += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return [f"s3://{bucket}/{k}" for k in keys], [
            f"s3://{bucket}/{p}".rstrip("/") for p in dirs
        ]

    def parquet_files(self, d: str) -> list[str]:
        return sorted(k for k in self._list(d)[0] if k.endswith(".parquet"))

    def subdirs(self, d: str) -> list[str]:
        return sorted(self._list(d)[1])

    def has(self, d: str, name: str) -> bool:
        return self.join(d, name) in self._list(d)[0]

    def join(self, d: str, name: str) -> str:
        return f"{d.rstrip('/')}/{name}"

    def read_text(self, d: str, name: str) -> str | None:
        bucket, prefix = self._split(d)
        try:
            body = s3_client().get_object(Bucket=bucket, Key=prefix + name)["Body"].read()
            return body.decode()
        except Exception:  # no manifest, or unreadable: the samples still show
            return None

    def describe(self, d: str) -> str:
        files, dirs = self._list(d)
        return f"{len(files)} object(s) and {len(dirs)} prefix(es)"
