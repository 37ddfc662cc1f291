"""The task behind a trainer's row, found one way for every bridge.

A trainer hands us rows of its own dataset; each names one of our tasks in a mapping of
fields it carries through untouched (SkyRL's `env_extras`, slime's `Sample.metadata`,
verl's `extra_info`): `rollout_task` holds the whole `RolloutTask` (a mapping or JSON
text), else `task_id` names one of the tasks the bridge was configured with. Errors name
the row (`where`) and the field, so a bad dataset line is found without a debugger.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.tasks import RolloutTask, load_tasks

TASK_KEY = "rollout_task"
"""The field holding a whole `RolloutTask` (a mapping or its JSON)."""
TASK_ID_KEY = "task_id"
"""The field naming a task of the bridge's configured tasks."""


def find_task(
    fields: Mapping[str, Any],
    tasks: Mapping[str, RolloutTask] | None,
    *,
    where: str,
    tasks_name: str,
    error: type[ValueError] = ValueError,
    need_reward: bool = False,
) -> RolloutTask:
    """The task `fields` carry or name. `where` locates the fields in messages (e.g.
    `env_extras[3]`), `tasks_name` says where a `task_id` is looked up; `error` is the
    bridge's own exception type; `need_reward` refuses a task without evaluation."""
    raw = fields.get(TASK_KEY)
    if raw is not None:
        try:
            data = json.loads(raw) if isinstance(raw, str | bytes) else dict(raw)
            task = RolloutTask.model_validate(data)
        except (ValueError, TypeError, ValidationError) as exc:
            raise error(f"{where}.{TASK_KEY} is not a RolloutTask: {exc}") from None
    else:
        task_id = fields.get(TASK_ID_KEY)
        if task_id is None:
            raise error(f"{where} has neither {TASK_KEY!r} nor {TASK_ID_KEY!r}")
        if tasks is None:
            raise error(f"{where}.{TASK_ID_KEY} needs {tasks_name}")
        if str(task_id) not in tasks:
            raise error(f"{where}.{TASK_ID_KEY} {str(task_id)!r} is not in {tasks_name}")
        task = tasks[str(task_id)]
    if need_reward:
        require_reward(task, where, error)
    return task


def require_reward(task: RolloutTask, where: str, error: type[ValueError] = ValueError) -> None:
    """Refuse a task a training rollout cannot be scored on (no evaluation)."""
    if task.evaluation is None:
        raise error(f"{where}: task {task.task_id!r}: evaluation is missing (no reward)")


def task_table(
    source: str | Path | Iterable[RolloutTask] | Mapping[str, RolloutTask] | None,
) -> dict[str, RolloutTask] | None:
    """The tasks a bridge was configured with, by id: from a JSONL path, a list or a
    mapping; None stays None (rows must then carry their whole task)."""
    if source is None:
        return None
    if isinstance(source, str | Path):
        source = load_tasks(Path(source))
    if isinstance(source, Mapping):
        return dict(source)
    return {t.task_id: t for t in source}


def require_group_size(
    size: int, where: str, *, minimum: int = 2, hint: str = "", error: type[ValueError] = ValueError
) -> None:
    """Refuse a GRPO group too small to have a baseline (`hint`: the trainer's setting)."""
    if size < minimum:
        said = f" ({hint})" if hint else ""
        raise error(f"{where}: {size}; a GRPO group needs at least {minimum} rollouts{said}")
