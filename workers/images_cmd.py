"""`rollout images build PATH...`: build the environments of a task source on this host.

What a fleet runs on each sandbox host (or once, before pushing to a registry) so the
first rollouts find their images built: every distinct Dockerfile once, cached like a
provision would (`sandboxes.image.task_images`). Tasks whose environment cannot be made are
listed with the reason; the exit status is 1 when there are any.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

images_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Task environments (Docker images)"
)


def parse_image_map(items: list[str]) -> dict[str, str]:
    """`FROM=LOCAL_TAG` items → a map; a malformed one is a usage error naming it."""
    out: dict[str, str] = {}
    for item in items:
        src, eq, dst = item.partition("=")
        if not eq or not src.strip() or not dst.strip():
            raise typer.BadParameter(f"{item!r}: expected FROM=LOCAL_TAG", param_hint="--image-map")
        out[src.strip()] = dst.strip()
    return out


@images_app.command("build")
def build_cmd(
    paths: Annotated[list[Path], typer.Argument(help="task sources (directories or files)")],
    image_map: Annotated[
        list[str] | None,
        typer.Option("--image-map", help="FROM=LOCAL_TAG: a base image that cannot be pulled"),
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="task format (default: detect)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
) -> None:
    """Build every distinct task environment under PATHS once (cached per host)."""
    from sandboxes.image.task_images import DockerUnavailable, prebuild_tasks
    from task_formats.base import LoadOptions
    from task_formats.registry import load_task_source

    options = LoadOptions(image_map=parse_image_map(image_map or []))
    tasks = []
    refused: list[tuple[str, str]] = []
    for path in paths:
        try:
            loaded = load_task_source(path, options, fmt)
        except ValueError as exc:
            typer.echo(f"{path}: {exc}", err=True)
            raise typer.Exit(2) from None
        tasks += loaded.tasks
        refused += [(r.source, f"{r.field or 'task'}: {r.reason}") for r in loaded.refused]
    try:
        result = prebuild_tasks(tasks)
    except DockerUnavailable as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    refused += result.refused
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "images": [i.model_dump(mode="json") for i in result.images],
                    "ready": [t.task_id for t in result.tasks],
                    "refused": [{"task": t, "reason": r} for t, r in refused],
                }
            )
        )
    else:
        for img in result.images:
            state = "cached" if img.cached else f"built in {img.build_seconds:g}s"
            typer.echo(f"{img.tag} {img.image_id[:19]} ({state})")
        for task_id, reason in refused:
            typer.echo(f"refused {task_id}: {reason}", err=True)
        typer.echo(f"{len(result.tasks)} task(s) ready, {len(refused)} refused")
    if refused:
        raise typer.Exit(1)
