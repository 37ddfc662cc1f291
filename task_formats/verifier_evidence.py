"""Evidence that a task's verifier works without the agent: recorded by oracle runs,
carried by later runs' tasks.

Why: after an agent ran, a verifier that wrote no reward (test.sh killed, its reward
dir emptied, its test runner ended early, a time-out) is either broken or broken *by the
agent*, and the sandbox alone cannot always tell. A run of the same verifier on the
same task and image where the agent could not interfere — the task's own solution,
`rollout run DATASET --harness oracle` — that finished within its timeout and wrote a
reward in range shows it works; from then on such a failure is the agent's. The tests
never reach an agent (they arrive only for the evaluation), and the agent's sandbox is
not touched.

The record is a JSON file on the machine that reads the dataset (`default_path`,
``--verifier-evidence``): the oracle run writes it (`record`), later runs of the same
dataset mark each covered task's `RewardFileCheck.shown_working` (`apply`), and the
mark travels inside the task to whichever host evaluates it. A record is keyed by what
decides whether the verifier can work (`evidence_key`): the task's content hash (its
task.toml, tests and environment), its image (the name, or the build context's hash),
the sandbox backend and the reward function version (the verifier's settings and the
reward range). An oracle rollout that ends `eval_error` or `agent_broke_sandbox` drops
the record: the verifier did not work there after all.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from schemas.evaluation import RewardFileCheck, VerifierEvidence
from schemas.rollout import RolloutResult
from schemas.tasks import RolloutTask

#: Overrides the default location (`default_path`).
EVIDENCE_ENV = "ROLLOUT_VERIFIER_EVIDENCE"
_VERSION = 1
#: Oracle outcomes that show the verifier does not work where it was recorded.
_DISPROVED = ("eval_error", "agent_broke_sandbox")


def default_path() -> Path:
    """`$ROLLOUT_VERIFIER_EVIDENCE`, else ``$XDG_STATE_HOME/agentic-rollout/
    verifier-evidence.json`` (``~/.local/state/...``)."""
    env = os.environ.get(EVIDENCE_ENV)
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state")
    return base / "agentic-rollout" / "verifier-evidence.json"


def _verifier(task: RolloutTask) -> RewardFileCheck | None:
    """The task's one reward-file check (None: none, or several)."""
    checks = [c for c in (task.evaluation.checks if task.evaluation else [])
              if isinstance(c, RewardFileCheck)]  # fmt: skip
    return checks[0] if len(checks) == 1 else None


def evidence_key(task: RolloutTask) -> str | None:
    """The record's key for `task` (None: evidence cannot apply to it: no content hash,
    or not exactly one reward-file check)."""
    if task.source is None or not task.source.content_hash or _verifier(task) is None:
        return None
    build = task.sandbox.build
    parts = {
        "content_hash": task.source.content_hash,
        "image": build.content_hash if build else task.sandbox.spec_fields().get("image"),
        "backend": task.sandbox.backend,
        "reward_fn": task.reward_fn_id(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def load(path: Path) -> dict[str, VerifierEvidence]:
    """The records in `path` (none when it does not exist); ValueError naming the
    file when it is not a record file."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a verifier evidence file ({e})") from None
    if not isinstance(raw, dict) or raw.get("version") != _VERSION:
        raise ValueError(f"{path}: not a verifier evidence file (version {_VERSION})")
    try:
        return {k: VerifierEvidence.model_validate(v) for k, v in raw["records"].items()}
    except (KeyError, AttributeError, ValidationError) as e:
        raise ValueError(f"{path}: a record is malformed ({e})") from None


def apply(tasks: list[RolloutTask], path: Path) -> tuple[list[RolloutTask], int]:
    """`tasks` with each covered verifier's `shown_working` set from the records at
    `path`, and how many were covered."""
    records = load(path)
    out: list[RolloutTask] = []
    covered = 0
    for task in tasks:
        key = evidence_key(task)
        evidence = records.get(key) if key else None
        check = _verifier(task)
        if evidence is None or check is None or task.evaluation is None:
            out.append(task)
            continue
        low, high = check.reward_range
        if not low <= evidence.reward <= high:
            out.append(task)
            continue
        checks = [
            c.model_copy(update={"shown_working": evidence}) if c is check else c
            for c in task.evaluation.checks
        ]
        evaluation = task.evaluation.model_copy(update={"checks": checks})
        out.append(task.model_copy(update={"evaluation": evaluation}))
        covered += 1
    return out, covered


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer at a time (two oracle runs finishing together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def record(
    path: Path, tasks: Iterable[RolloutTask], results: Iterable[RolloutResult]
) -> tuple[int, int]:
    """Record the oracle's finished rollouts of `tasks` in `path`: an `ok` one whose
    reward is in range records (or renews) its task's evidence, an `eval_error` or
    `agent_broke_sandbox` one drops it. Returns (recorded, dropped)."""
    by_id = {t.task_id: t for t in tasks}
    recorded = dropped = 0
    with _locked(path):
        records = load(path)
        for result in results:
            task = by_id.get(result.task_id)
            key = evidence_key(task) if task else None
            check = _verifier(task) if task else None
            if task is None or key is None or check is None:
                continue
            if result.status in _DISPROVED:
                dropped += records.pop(key, None) is not None
                continue
            low, high = check.reward_range
            if result.status != "ok" or result.reward is None:
                continue
            if not low <= result.reward <= high:
                continue
            pulled = task.sandbox.build is None
            records[key] = VerifierEvidence(
                rollout_id=result.rollout_id,
                reward=result.reward,
                image_digest=result.image_digest if pulled else None,
                recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            recorded += 1
        payload = {
            "version": _VERSION,
            "records": {k: v.model_dump(mode="json") for k, v in sorted(records.items())},
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1) + "\n")
        tmp.replace(path)
    return recorded, dropped
