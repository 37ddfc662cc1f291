"""The tiny model's commands, the CLI's one way into `devstack` besides the demo.

`rollout make-tiny-model` builds the deterministic tiny model, or a family's variant
from that family's real chat template. `rollout templates fetch` gets those real chat
templates (which the tests read too) into the cache: third-party files the repository
does not carry (see ``devstack.real_templates``), each checked against its pinned sha256
before it is written.
"""

from pathlib import Path
from typing import Annotated

import typer


def make_tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="output directory")],
    family: Annotated[
        str | None,
        typer.Option(
            help="a published model family (its chat template's name, e.g. glm-4.7-flash): "
            "its special tokens, real chat template and end-of-turn ids"
        ),
    ] = None,
) -> None:
    """Build the deterministic tiny test/demo model (tokenizer, chat template, weights)."""
    if family is None:
        from devstack.tiny_model import build_tiny_model

        typer.echo(build_tiny_model(out_dir).model_dump_json(indent=2))
        return
    from devstack.real_templates import TemplateChecksumError, TemplatesUnavailable
    from devstack.tiny_families import UnknownFamily, build_family_model

    try:
        info = build_family_model(out_dir, family)
    except (UnknownFamily, TemplatesUnavailable, TemplateChecksumError) as exc:
        typer.echo(f"make-tiny-model: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(info.model_dump_json(indent=2))


templates_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Real chat templates (test data)"
)


@templates_app.command("fetch")
def fetch_cmd(
    dest: Annotated[
        Path | None,
        typer.Option(
            help="directory for <name>.jinja (default: $ROLLOUT_TEMPLATES_DIR when set, "
            "else $ROLLOUT_CACHE_DIR/chat_templates)"
        ),
    ] = None,
    hub_url: Annotated[
        str | None,
        typer.Option(
            envvar="HF_ENDPOINT", help="model hub base URL (default: https://huggingface.co)"
        ),
    ] = None,
    mirror_url: Annotated[
        str, typer.Option(help="raw git file host, tried when the hub copy differs")
    ] = "https://raw.githubusercontent.com",
) -> None:
    """Download the manifest's templates, each checked against its pinned sha256.

    The hub is tried first, then the template's mirror; files are written atomically and
    files already present with the right checksum are kept."""
    from devstack.real_templates import TEMPLATES_DIR_ENV, default_fetch_dir, templates_dir
    from devstack.template_fetch import FetchError, fetch_templates

    target = (dest or default_fetch_dir()).expanduser()
    try:
        results = fetch_templates(target, hub_url=hub_url, mirror_url=mirror_url)
    except FetchError as e:
        typer.echo(f"templates fetch failed:\n{e}", err=True)
        raise typer.Exit(1) from None
    for r in results:
        typer.echo(f"{r.origin:8} {r.path}")
    typer.echo(f"{len(results)} templates in {target}")
    if target.resolve() != templates_dir().resolve():
        typer.echo(f"the tests read {templates_dir()}; set {TEMPLATES_DIR_ENV}={target}")


@templates_app.command("check")
def check_cmd() -> None:
    """Say where the tests read the templates from and whether each is there and intact
    (exit 1 if not)."""
    from devstack.real_templates import how_to_get_them, template_problems, templates_dir

    folder = templates_dir()
    problems = template_problems(folder)
    for line in problems:
        typer.echo(line, err=True)
    if problems:
        typer.echo(how_to_get_them(), err=True)
        raise typer.Exit(1)
    typer.echo(f"all templates present and intact in {folder}")
