"""Verifier evidence (`task_formats.verifier_evidence`): what an oracle run records, what
a later run of the same dataset marks, and what it does not — on the Harbor test tasks
(tests/data/harbor) read by the real loader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer

from schemas.evaluation import RewardFileCheck
from schemas.rollout import RolloutResult
from schemas.tasks import HarnessSpec, RolloutTask
from task_formats import LoadOptions, load_task_source
from task_formats import verifier_evidence as ve
from workers.task_source_cmd import parse_reward_range

GOOD = Path(__file__).resolve().parents[1] / "data" / "harbor"
IMAGE_MAP = {"ubuntu:24.04": "agentic-rollout/sandbox-base:latest"}


def load(path: Path, harness: str = "oracle", **kw: Any) -> list[RolloutTask]:
    opts = LoadOptions(harness=HarnessSpec(name=harness), image_map=dict(IMAGE_MAP), **kw)
    loaded = load_task_source(path, opts, "harbor")
    assert not loaded.refused, loaded.refused
    return loaded.tasks


def result(task: RolloutTask, status: str = "ok", reward: float | None = 1.0) -> RolloutResult:
    """A finished oracle rollout of `task`, as the workflow reports it."""
    return RolloutResult(
        rollout_id=f"b-{task.task_id}-0",
        batch_id="b",
        task_id=task.task_id,
        group_id=f"b-{task.task_id}",
        sample_index=0,
        status=status,  # type: ignore[arg-type]
        reward=reward,
        harness="oracle",
        harness_version="oracle-1",
        policy_version="unversioned",
        env_version=task.source.content_hash if task.source else None,
        image_digest="sha256:built-here",
    )


def shown(task: RolloutTask) -> Any:
    [check] = [c for c in task.evaluation.checks if isinstance(c, RewardFileCheck)]  # type: ignore[union-attr]
    return check.shown_working


def test_an_oracle_success_marks_the_same_task_in_a_later_run(tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    oracle = load(GOOD)
    ok, failed = oracle[0], oracle[1]
    recorded, dropped = ve.record(store, oracle, [result(ok), result(failed, "eval_error", None)])
    assert (recorded, dropped) == (1, 0)
    later, covered = ve.apply(load(GOOD, harness="command"), store)
    assert covered == 1
    marks = {t.task_id: shown(t) for t in later}
    evidence = marks.pop(ok.task_id)
    assert evidence.rollout_id == f"b-{ok.task_id}-0" and evidence.reward == 1.0
    # A built environment (its Dockerfile) gives another image id on every host.
    assert evidence.image_digest is None and evidence.recorded_at
    assert all(m is None for m in marks.values()), marks
    # The reward function (and so the samples' lineage) is the same with the mark.
    before = {t.task_id: t.reward_fn_id() for t in load(GOOD, harness="command")}
    assert {t.task_id: t.reward_fn_id() for t in later} == before


def test_a_failed_oracle_drops_the_evidence(tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    task = load(GOOD)[0]
    assert ve.record(store, [task], [result(task)]) == (1, 0)
    assert ve.record(store, [task], [result(task, "agent_broke_sandbox", 0.0)]) == (0, 1)
    assert ve.apply([task], store)[1] == 0
    # An infra failure or a time-out of the solution says nothing about the verifier.
    assert ve.record(store, [task], [result(task)]) == (1, 0)
    assert ve.record(store, [task], [result(task, "agent_timeout", 0.0)]) == (0, 0)
    assert ve.apply([task], store)[1] == 1


def test_an_out_of_range_oracle_reward_records_nothing(tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    task = load(GOOD)[0]
    assert ve.record(store, [task], [result(task, reward=1.5)]) == (0, 0)
    assert not store.exists() or ve.load(store) == {}


@pytest.mark.parametrize(
    "change",
    ["tests", "backend", "image_map", "reward_range"],
)
def test_evidence_covers_only_the_same_task_image_backend_and_range(
    tmp_path: Path, change: str
) -> None:
    store = tmp_path / "evidence.json"
    root = tmp_path / "ds"
    shutil.copytree(GOOD / "hello", root / "hello")
    [task] = load(root)
    ve.record(store, [task], [result(task)])
    assert ve.apply(load(root, harness="command"), store)[1] == 1
    kw: dict[str, Any] = {}
    if change == "tests":
        (root / "hello" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > x\n")
    elif change == "backend":
        kw["backend"] = "local"
    elif change == "image_map":
        kw["image_map"] = {"ubuntu:24.04": "someone/else:1"}
    else:
        kw["reward_range"] = (0.0, 10.0)
    opts = LoadOptions(harness=HarnessSpec(name="command"), **{"image_map": IMAGE_MAP, **kw})
    later = load_task_source(root, opts, "harbor").tasks
    assert ve.apply(later, store)[1] == 0


def test_a_pulled_image_records_its_id(tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    root = tmp_path / "ds" / "pulled"
    shutil.copytree(GOOD / "hello", root)
    shutil.rmtree(root / "environment")
    (root / "environment").mkdir()
    toml = (root / "task.toml").read_text()
    (root / "task.toml").write_text(
        toml.replace("[environment]", '[environment]\ndocker_image = "ubuntu:24.04"', 1)
        if "[environment]" in toml
        else toml + '\n[environment]\ndocker_image = "ubuntu:24.04"\n'
    )
    [task] = load(root)
    assert task.sandbox.build is None
    ve.record(store, [task], [result(task)])
    [later] = ve.apply(load(root, harness="command"), store)[0]
    assert shown(later).image_digest == "sha256:built-here"


def test_a_malformed_store_is_refused_naming_it(tmp_path: Path) -> None:
    store = tmp_path / "evidence.json"
    store.write_text(json.dumps({"version": 1, "records": {"k": {"reward": "x"}}}))
    with pytest.raises(ValueError, match=str(store)):
        ve.load(store)
    store.write_text("[]")
    with pytest.raises(ValueError, match="not a verifier evidence file"):
        ve.load(store)


def test_the_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ve.EVIDENCE_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert ve.default_path() == tmp_path / "agentic-rollout" / "verifier-evidence.json"
    monkeypatch.setenv(ve.EVIDENCE_ENV, str(tmp_path / "x.json"))
    assert ve.default_path() == tmp_path / "x.json"


def test_the_reward_range_option() -> None:
    assert parse_reward_range(None) == (0.0, 1.0)
    assert parse_reward_range("0,10") == (0.0, 10.0)
    assert parse_reward_range("-1,1") == (-1.0, 1.0)
    for bad in ["1", "a,b", "1,1", "2,1", "0,inf"]:
        with pytest.raises(typer.BadParameter):
            parse_reward_range(bad)
    [task] = load(GOOD / "hello", reward_range=(0.0, 10.0))
    [check] = task.evaluation.checks  # type: ignore[union-attr]
    assert isinstance(check, RewardFileCheck) and check.reward_range == (0.0, 10.0)


def test_rollout_run_records_after_an_oracle_batch_and_marks_the_next_run(
    tmp_path: Path,
) -> None:
    """The command line's two halves: an oracle run's outcomes recorded in the file
    `--verifier-evidence` names, and a later run with another harness reading it."""
    from rich.console import Console

    from rollout_client.client import Batch, RolloutOutcome
    from workers.run_cmd import BatchReport, _record_evidence
    from workers.task_source_cmd import TaskSourceArgs

    store = tmp_path / "evidence.json"

    def args(harness: str) -> TaskSourceArgs:
        return TaskSourceArgs(
            task_format="harbor",
            harness=harness,
            harness_config=None,
            backend="docker",
            image_map=["ubuntu:24.04=agentic-rollout/sandbox-base:latest"],
            image_map_file=None,
            public_network="no-network",
            format_option=None,
            verifier_evidence=store,
        )

    console = Console(record=True, width=200)
    oracle_tasks = args("oracle").read(GOOD, console)
    ok = oracle_tasks[0]
    report = BatchReport(
        Batch(batch_id="b", output=str(tmp_path), rollout_ids=["r"], groups={}),
        outcomes=[
            RolloutOutcome(rollout_id="r", workflow_status="COMPLETED", result=result(ok)),
            RolloutOutcome(rollout_id="x", workflow_status="FAILED", error="host lost"),
        ],
    )
    _record_evidence(args("oracle"), oracle_tasks, report, console)
    assert f"verifier evidence: 1 task(s) recorded, 0 dropped → {store}" in console.export_text()
    later = args("command").read(GOOD, console)
    assert [t.task_id for t in later if shown(t) is not None] == [ok.task_id]
    assert f"verifier evidence: 1 of {len(later)} task(s) shown working" in console.export_text()
