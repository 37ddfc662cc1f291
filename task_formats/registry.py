"""The task formats by name, and choosing one for a path."""

from __future__ import annotations

from pathlib import Path

from task_formats.base import LoadedTasks, LoadOptions, TaskFormat
from task_formats.harbor import HarborFormat
from task_formats.jsonl import JsonlFormat
from task_formats.swebench import SweBenchFormat

#: Every format by name; detection tries them in this order (`swebench` never claims
#: a path: its JSONL looks like ours, so a run names it).
FORMATS: dict[str, TaskFormat] = {
    f.name: f for f in (JsonlFormat(), HarborFormat(), SweBenchFormat())
}


def detect_format(path: Path) -> str:
    """The name of the format `path` is in, or a ValueError listing what was tried."""
    for name, fmt in FORMATS.items():
        if fmt.detect(path):
            return name
    raise ValueError(
        f"{path}: not a task source of any known format ({', '.join(FORMATS)}); "
        "name one with --format"
    )


def load_task_source(
    path: Path | str, options: LoadOptions | None = None, fmt: str | None = None
) -> LoadedTasks:
    """Read `path` as `fmt` (detected when None); see `TaskFormat.load`."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    name = fmt or detect_format(path)
    if name not in FORMATS:
        raise ValueError(f"unknown task format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name].load(path, options or LoadOptions())
