"""Command-line options generated from a pydantic model, so a setting is declared once
(the field: name, help, default, type, bounds) and its option cannot drift from it.

A typer command declares a parameter annotated with the model and is decorated with
`model_options("that parameter")`: its command line gets one option per field in that
place (`OptionSpec` in a field's `Annotated` renames it, or leaves it out), and the command
receives the validated model. Literal choices are spelled with `-` for `_` on the command
line; a field's `ge`/`le` bounds are the option's range; a model's refusal is a usage
error naming the option."""

import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import typer
from annotated_types import Ge, Le
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gateway.options import OptionSpec

Command = TypeVar("Command", bound=Callable[..., Any])


def option_spec(info: FieldInfo) -> OptionSpec:
    return next((m for m in info.metadata if isinstance(m, OptionSpec)), OptionSpec())


def literal_values(annotation: Any) -> tuple[Any, ...]:
    """The choices of a Literal, or of a union of Literals (and None); () otherwise."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        parts = [literal_values(a) for a in typing.get_args(annotation) if a is not type(None)]
        if all(parts):
            return tuple(v for part in parts for v in part)
    return ()


@dataclass(frozen=True)
class FieldOption:
    """One field as a typer parameter: `spelled` maps a choice as typed to the model's."""

    field: str
    flag: str
    parameter: inspect.Parameter
    spelled: dict[str, Any]

    def value(self, given: Any) -> Any:
        return self.spelled.get(given, given) if self.spelled else given


def field_option(field: str, info: FieldInfo) -> FieldOption:
    spec = option_spec(info)
    kind = spec.type or info.annotation
    choices = literal_values(kind)
    spelled = {str(c).replace("_", "-"): c for c in choices}
    if spelled:
        kind = Literal[tuple(spelled)]  # type: ignore[valid-type]
    default: Any = inspect.Parameter.empty
    if not info.is_required():
        default = None if info.default_factory is not None else info.default
        default = next((k for k, v in spelled.items() if v == default), default)
    if default is None:
        kind = kind | None
    bounds = {type(m): m for m in info.metadata}
    option = typer.Option(
        *([spec.name] if spec.name else []),
        help=info.description,
        envvar=spec.envvar,
        min=bounds[Ge].ge if Ge in bounds else None,
        max=bounds[Le].le if Le in bounds else None,
    )
    parameter = inspect.Parameter(
        field, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, option], default=default
    )
    return FieldOption(field, spec.name or "--" + field.replace("_", "-"), parameter, spelled)


def field_options(model: type[BaseModel]) -> list[FieldOption]:
    """The model's offered fields as options, the required ones first."""
    offered = [(f, i) for f, i in model.model_fields.items() if option_spec(i).offered]
    offered.sort(key=lambda item: not item[1].is_required())
    return [field_option(field, info) for field, info in offered]


def problems(exc: ValidationError, options: list[FieldOption]) -> str:
    """The model's refusal, each problem named by its option."""
    flags = {o.field: o.flag for o in options}
    named = []
    for error in exc.errors():
        flag = flags.get(str(error["loc"][0])) if error["loc"] else None
        named.append(f"{flag}: {error['msg']}" if flag else error["msg"])
    return "; ".join(named)


def model_options(param: str) -> Callable[[Command], Command]:
    """Replace the command's `param` (annotated with a pydantic model) by the model's
    fields as options; the command is called with the validated model."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        model = signature.parameters[param].annotation
        options = field_options(model)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index(param)
        params[at : at + 1] = [o.parameter for o in options]
        # typer reads the command's parameters from its signature: keyword-only from
        # `param` on, so a required option may follow one with a default.
        params = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if i >= at else p
            for i, p in enumerate(params)
        ]

        @functools.wraps(command)
        def with_model(*args: Any, **kwargs: Any) -> Any:
            given = {o.field: o.value(kwargs.pop(o.field)) for o in options}
            try:
                settings = model.model_validate({k: v for k, v in given.items() if v is not None})
            except ValidationError as exc:
                raise typer.BadParameter(problems(exc, options)) from None
            return command(*args, **{param: settings}, **kwargs)

        with_model.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_model.__annotations__ = {p.name: p.annotation for p in params}
        return with_model  # type: ignore[return-value]

    return decorate
