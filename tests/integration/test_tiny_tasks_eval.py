"""Every tiny-family task is scored by the real `evaluate` hook in a real sandbox:
its reference answer (written as the task agent writes it) earns 1, a near miss 0."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from devstack.tiny_model.tasks import heldout_cases, train_cases, write_task_files, wrong_answer
from hooks.evaluate import evaluate
from sandboxes.base import SandboxSpec
from schemas.tasks import load_tasks

pytestmark = pytest.mark.integration


async def test_reference_answers_pass_and_wrong_answers_fail(
    local_backend: Any, tmp_path: Path
) -> None:
    train_path, heldout_path = write_task_files(tmp_path, seed=0, n_train=64, n_heldout=64)
    heldout = heldout_cases(0, 64)
    cases = {c.task_id: c for c in [*train_cases(0, 64, heldout), *heldout]}
    tasks = [*load_tasks(train_path), *load_tasks(heldout_path)]
    assert sorted(t.task_id for t in tasks) == sorted(cases)
    sb = await local_backend.create(SandboxSpec(rollout_id=f"tiny-{uuid.uuid4().hex[:8]}"))
    try:
        for task in tasks:
            case, spec = cases[task.task_id], task.evaluation
            assert spec is not None
            await sb.put_file(f"{sb.workdir}/answer.txt", case.answer + "\n")
            right = await evaluate(sb, spec, sb.workdir)
            await sb.put_file(f"{sb.workdir}/answer.txt", wrong_answer(case) + "\n")
            wrong = await evaluate(sb, spec, sb.workdir)
            assert (right.status, right.reward, wrong.status, wrong.reward) == (
                "ok",
                1.0,
                "ok",
                0.0,
            ), task.task_id
    finally:
        await local_backend.destroy(sb.handle)
