"""Task sources a user brings: our JSONL, Harbor task directories, SWE-bench instances.

Each format is one module that turns files into `RolloutTask`s (pure reading and
validation: no Docker, no Temporal), behind a registry. What a task needs built or
enforced on the sandbox host (its Dockerfile, its network policy) travels in the task
as data; the sandbox host does it. See docs/tasks.md, "Bring your dataset".
"""

from task_formats.base import LoadedTasks, LoadOptions, RefusedTask
from task_formats.registry import FORMATS, detect_format, load_task_source

__all__ = [
    "FORMATS",
    "LoadOptions",
    "LoadedTasks",
    "RefusedTask",
    "detect_format",
    "load_task_source",
]
