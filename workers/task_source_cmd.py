"""What `rollout run` and `rollout demo` share: reading a task source from the command line.

A task source is our JSONL file or a dataset (a Harbor task directory, a directory of
them, SWE-bench instances) read by `task_formats`. Datasets name no agent, sandbox
backend or image policy, so the run chooses them here (`--harness`, `--backend`,
`--image-map`, `--public-network`, `--env-allow`, `--build-network`). Refused tasks are
printed one line each and the rest runs; a source with nothing left to run is an error.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import typer
from rich.console import Console

from schemas.environment import BuildNetwork
from schemas.evaluation import valid_reward_range
from schemas.tasks import HarnessSpec, RolloutTask
from task_formats import (
    FORMATS,
    LoadedTasks,
    LoadOptions,
    detect_format,
    load_task_source,
    verifier_evidence,
)
from task_formats.base import PublicNetwork

FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", help="task source format: auto (detected), jsonl, harbor, swebench, …"
    ),
]
HarnessOpt = Annotated[
    str | None,
    typer.Option("--harness", help="datasets: the agent to run (e.g. claude_code, oracle)"),
]
HarnessConfigOpt = Annotated[
    Path | None,
    typer.Option("--harness-config", help="datasets: JSON file, the harness's config object"),
]
ImageMapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--image-map",
        help="datasets: FROM=TO, a base image that cannot be pulled → a local tag (repeatable)",
    ),
]
ImageMapFileOpt = Annotated[
    Path | None,
    typer.Option("--image-map-file", help="datasets: image map as a JSON object or FROM=TO lines"),
]
FormatOptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--format-option",
        help="datasets: KEY=VALUE, a setting of the format (VALUE read as JSON when it "
        "parses, else as text; repeatable), e.g. swebench's repo_url_template",
    ),
]
PublicNetworkOpt = Annotated[
    str,
    typer.Option(
        "--public-network",
        help="datasets: a task asking for the public network: no-network (run without, "
        "noted), allow, or refuse",
    ),
]
RewardRangeOpt = Annotated[
    str | None,
    typer.Option(
        "--reward-range",
        help="Harbor datasets: LOW,HIGH, the range every reward lies in (default 0,1); "
        "a verifier's reward outside it is the agent's failure",
    ),
]
EvidenceOpt = Annotated[
    Path | None,
    typer.Option(
        "--verifier-evidence",
        help="datasets: the file of oracle runs that showed each verifier works "
        "(written by --harness oracle, read by other runs; default "
        "$ROLLOUT_VERIFIER_EVIDENCE or ~/.local/state/agentic-rollout/verifier-evidence.json)",
    ),
]
_PUBLIC = ("no-network", "allow", "refuse")
EnvAllowOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--env-allow",
        help="datasets: NAME[,NAME…], a variable of this process's environment a task's "
        "env may read as ${NAME} (repeatable); a task naming any other is refused, so a "
        "dataset cannot copy tokens or cloud keys into the sandbox",
    ),
]
BuildNetworkOpt = Annotated[
    str,
    typer.Option(
        "--build-network",
        help="datasets: the network of a task Dockerfile's RUN steps: none (the default: "
        "a dataset's build cannot fetch code or reach this host's services; bases come "
        "from --image-map), default (docker's bridge) or host",
    ),
]
_BUILD_NETWORKS = get_args(BuildNetwork)


def parse_reward_range(text: str | None) -> tuple[float, float]:
    """`LOW,HIGH` as two floats (None: [0, 1])."""
    if text is None:
        return (0.0, 1.0)
    low, _, high = text.partition(",")
    try:
        return valid_reward_range((float(low), float(high)))
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: LOW,HIGH, two finite numbers with LOW < HIGH", param_hint="--reward-range"
        ) from None


def _pair(text: str, where: str) -> tuple[str, str]:
    source, sep, target = text.partition("=")
    if not sep or not source.strip() or not target.strip():
        raise typer.BadParameter(f"{where}: {text!r} is not FROM=TO", param_hint="--image-map")
    return source.strip(), target.strip()


def parse_image_map(pairs: list[str] | None, file: Path | None) -> dict[str, str]:
    """`--image-map-file` (JSON object, or FROM=TO lines with # comments), then every
    `--image-map FROM=TO` on top."""
    mapping: dict[str, str] = {}
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise typer.BadParameter(str(exc), param_hint="--image-map-file") from None
        if text.lstrip().startswith("{"):
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise typer.BadParameter(
                    f"{file}: not valid JSON: {exc}", param_hint="--image-map-file"
                ) from None
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
                raise typer.BadParameter(
                    f"{file}: image names and tags must be strings", param_hint="--image-map-file"
                )
            mapping.update(data)
        else:
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip() and not line.lstrip().startswith("#"):
                    source, target = _pair(line, f"{file}:{number}")
                    mapping[source] = target
    for pair in pairs or []:
        source, target = _pair(pair, "--image-map")
        mapping[source] = target
    return mapping


def parse_format_options(pairs: list[str] | None) -> dict[str, Any]:
    """`--format-option KEY=VALUE` pairs; a VALUE that parses as JSON is taken as JSON
    (objects, numbers, booleans), any other as its text."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--format-option")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def parse_env_allow(items: list[str] | None) -> list[str]:
    """`--env-allow` values, each one name or a comma-separated list of names."""
    names = [n.strip() for item in items or [] for n in item.split(",") if n.strip()]
    for name in names:
        if not name.isidentifier() or not name.isascii():
            raise typer.BadParameter(f"{name!r} is not a variable name", param_hint="--env-allow")
    return names


def _harness_config(file: Path | None) -> dict[str, Any]:
    if file is None:
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{file}: {exc}", param_hint="--harness-config") from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{file}: must hold a JSON object", param_hint="--harness-config")
    return data


def load_options(
    *,
    harness: str | None,
    harness_config: Path | None,
    backend: str,
    image_map: list[str] | None,
    image_map_file: Path | None,
    public_network: str,
    format_options: list[str] | None = None,
    env_allow: list[str] | None = None,
    build_network: str = "none",
    reward_range: str | None = None,
) -> LoadOptions:
    """The command line's choices for a dataset, checked."""
    if public_network not in _PUBLIC:
        raise typer.BadParameter(
            f"{public_network!r}: one of {', '.join(_PUBLIC)}", param_hint="--public-network"
        )
    if build_network not in _BUILD_NETWORKS:
        raise typer.BadParameter(
            f"{build_network!r}: one of {', '.join(_BUILD_NETWORKS)}",
            param_hint="--build-network",
        )
    config = _harness_config(harness_config)
    if harness_config is not None and harness is None:
        raise typer.BadParameter("needs --harness", param_hint="--harness-config")
    spec = HarnessSpec(name=harness, config=config) if harness else None
    network: PublicNetwork = public_network  # type: ignore[assignment]
    return LoadOptions(
        harness=spec,
        backend=backend,
        image_map=parse_image_map(image_map, image_map_file),
        public_network=network,
        format_options=parse_format_options(format_options),
        env_allow=parse_env_allow(env_allow),
        build_network=build_network,  # type: ignore[arg-type]
        reward_range=parse_reward_range(reward_range),
    )


def read_task_source(
    path: Path, fmt: str, options: LoadOptions, console: Console
) -> list[RolloutTask]:
    """The tasks of `path`; each refused one printed; BadParameter when none is left."""
    name = None if fmt == "auto" else fmt
    if name is not None and name not in FORMATS:
        raise typer.BadParameter(
            f"{fmt!r}: one of auto, {', '.join(FORMATS)}", param_hint="--format"
        )
    try:
        name = name or detect_format(path)
        if name == "jsonl" and options.harness is not None:
            raise typer.BadParameter(
                "JSONL tasks name their own harness; --harness is for datasets",
                param_hint="--harness",
            )
        loaded: LoadedTasks = load_task_source(path, options, name)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="PATH") from None
    for refused in loaded.refused:
        console.print(f"refused: {refused}", markup=False, highlight=False, soft_wrap=True)
    if not loaded.tasks:
        raise typer.BadParameter(
            f"{path}: every task was refused ({len(loaded.refused)})", param_hint="PATH"
        )
    if loaded.refused:
        console.print(
            f"{len(loaded.tasks)} task(s) read, {len(loaded.refused)} refused",
            highlight=False,
        )
    return loaded.tasks


@dataclass(frozen=True)
class TaskSourceArgs:
    """The dataset options of a command line, as given (see `task_source_options`)."""

    task_format: str
    harness: str | None
    harness_config: Path | None
    backend: str
    image_map: list[str] | None
    image_map_file: Path | None
    public_network: str
    format_option: list[str] | None
    env_allow: list[str] | None = None
    build_network: str = "none"
    reward_range: str | None = None
    verifier_evidence: Path | None = None

    @property
    def evidence_path(self) -> Path:
        """Where oracle runs record, and other runs read, verifier evidence."""
        return self.verifier_evidence or verifier_evidence.default_path()

    def load_options(self) -> LoadOptions:
        return load_options(
            harness=self.harness,
            harness_config=self.harness_config,
            backend=self.backend,
            image_map=self.image_map,
            image_map_file=self.image_map_file,
            public_network=self.public_network,
            format_options=self.format_option,
            env_allow=self.env_allow,
            build_network=self.build_network,
            reward_range=self.reward_range,
        )

    def read(self, path: Path, console: Console) -> list[RolloutTask]:
        """The tasks of `path` under these options (`read_task_source`), each verifier
        an oracle run showed working marked so (`task_formats.verifier_evidence`)."""
        tasks = read_task_source(path, self.task_format, self.load_options(), console)
        if self.harness is None or not any(verifier_evidence.evidence_key(t) for t in tasks):
            return tasks
        try:
            tasks, covered = verifier_evidence.apply(tasks, self.evidence_path)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--verifier-evidence") from None
        console.print(
            f"verifier evidence: {covered} of {len(tasks)} task(s) shown working by an oracle "
            f"run ({self.evidence_path})",
            highlight=False,
            soft_wrap=True,
        )
        return tasks


Command = TypeVar("Command", bound=Callable[..., Any])


def task_source_options(*, backend: str, backend_help: str) -> Callable[[Command], Command]:
    """Give a typer command the dataset options, declared once here for `rollout run` and
    `rollout demo`: the command declares a `source: TaskSourceArgs` parameter, and its
    command line gets `--format`, `--harness`, … in that place (`backend` is the
    `--backend` default, which differs between them); the command receives them as one
    `TaskSourceArgs`."""
    declared: dict[str, tuple[Any, Any]] = {
        "task_format": (FormatOpt, "auto"),
        "harness": (HarnessOpt, None),
        "harness_config": (HarnessConfigOpt, None),
        "backend": (Annotated[str, typer.Option(help=backend_help)], backend),
        "image_map": (ImageMapOpt, None),
        "image_map_file": (ImageMapFileOpt, None),
        "public_network": (PublicNetworkOpt, "no-network"),
        "format_option": (FormatOptionOpt, None),
        "env_allow": (EnvAllowOpt, None),
        "build_network": (BuildNetworkOpt, "none"),
        "reward_range": (RewardRangeOpt, None),
        "verifier_evidence": (EvidenceOpt, None),
    }
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hint, default=default)
        for name, (hint, default) in declared.items()
    ]

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("source")
        params[at : at + 1] = options
        # typer reads the command's parameters from its signature: keyword-only from
        # `source` on, so the options after it keep their defaults' order.
        params = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i >= at else p
            for i, p in enumerate(params)
        ]

        @functools.wraps(command)
        def with_source(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in declared}
            return command(*args, source=TaskSourceArgs(**given), **kwargs)

        with_source.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_source.__annotations__ = {p.name: p.annotation for p in params}
        return with_source  # type: ignore[return-value]

    return decorate


def prebuild_images(tasks: list[RolloutTask], console: Console) -> list[RolloutTask]:
    """Build the environments tasks bring as Dockerfiles (and check their images) before
    anything is submitted, so a task whose environment cannot be made is refused here,
    with its build log's tail, and the rest run. Without a Docker engine on this machine
    the sandbox hosts build on their first cache miss instead."""
    if not any(t.sandbox.build or t.sandbox.spec_fields().get("image") for t in tasks):
        return tasks
    from sandboxes.image.task_images import DockerUnavailable, prebuild_tasks  # the docker SDK

    try:
        built = prebuild_tasks(tasks)
    except DockerUnavailable as exc:
        console.print(f"images not prebuilt here ({exc}); the sandbox hosts build them")
        return tasks
    for image in built.images:
        state = "cached" if image.cached else f"built in {image.build_seconds:.0f}s"
        console.print(f"image {image.tag} ({state})", highlight=False)
    for task_id, reason in built.refused:
        console.print(f"refused: {task_id}: {reason}", markup=False, highlight=False)
    if not built.tasks:
        raise typer.BadParameter(
            f"every task was refused ({len(built.refused)}): no environment could be made",
            param_hint="PATH",
        )
    return built.tasks
