"""Our own format: one `RolloutTask` per JSONL line (the tasks name their harness)."""

from __future__ import annotations

from pathlib import Path

from schemas.tasks import load_tasks
from task_formats.base import LoadedTasks, LoadOptions


class JsonlFormat:
    name = "jsonl"

    def detect(self, path: Path) -> bool:
        return path.is_file() and path.suffix in (".jsonl", ".json")

    def load(self, path: Path, options: LoadOptions) -> LoadedTasks:
        """The file's tasks; a bad line refuses the file (it names the line)."""
        return LoadedTasks(tasks=load_tasks(path))
