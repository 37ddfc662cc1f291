"""Reading JSON off the wire: the base models, body loading, field-path errors and headers
that every protocol adapter (and the engine client, for the engine's replies) shares.

Client requests are validated leniently about fields we ignore (SDKs, LangChain, Codex and
Claude Code send many) and strictly about the types of the fields we use. Every 400 names
the offending field path, e.g. `messages[2].content[0].text`, so a client author can fix it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.chat_template import RESERVED_TEMPLATE_VARIABLES
from gateway.errors import GatewayError
from schemas.sampling import SamplingParams

M = TypeVar("M", bound=BaseModel)

CREDENTIAL_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "cookie", "proxy-authorization"}
)
"""Never copied into a canonical request, which may be recorded."""

REQUEST_KIND_HEADER = "x-rollout-request-kind"
"""Scene marker an adapter adds from the client's own signals: `compaction`, or the kind of
request the client said it was sending (`turn`, `main`, `auxiliary`, ...)."""

SUBAGENT_HEADER = "x-rollout-subagent"
"""Scene marker an adapter adds for sub-agent calls; the value is the sub-agent kind."""

TOOL_CHOICE_MODES = ("none", "auto", "required")
"""The string forms of `tool_choice` in the OpenAI form the rest of the Gateway uses."""


class Wire(BaseModel):
    """A client's request object: unknown fields allowed (clients send plenty), known
    fields strictly typed (no `"5"` → 5)."""

    model_config = ConfigDict(extra="allow", strict=True)


class ReplyWire(BaseModel):
    """A reply from a server the Gateway calls: strictly typed, finite floats only, unknown
    fields ignored (servers add fields across versions)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


# --- field paths and validation errors ---------------------------------------------------------


def _is_union_tag(part: int | str) -> bool:
    """pydantic puts a union member's type name into `loc` (e.g. "str", "list[str]")."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or "[" in part)


def join_path(where: str, loc: tuple[int | str, ...]) -> str:
    """`messages[2]` + `("content", 0)` → `messages[2].content[0]`; union tags are skipped."""
    out = where
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += f".{part}" if out else str(part)
    return out


def _first_problem(exc: ValidationError, where: str) -> tuple[str, str]:
    """(path, what is wrong there) for the first failing field.

    Errors of several union branches at one path merge into one message, and a branch that
    got deeper (`stop[0]` under `stop`) is preferred because it says more.
    """
    by_path: dict[str, list[str]] = {}
    for e in exc.errors():
        msgs = by_path.setdefault(join_path(where, tuple(e["loc"])), [])
        msg = e["msg"].removeprefix("Value error, ")
        if msg not in msgs:
            msgs.append(msg)
    path = next(iter(by_path))
    for other in by_path:
        if other.startswith((path + "[", path + ".")):
            path = other
    others = [p for p in by_path if p != path and not path.startswith((p + "[", p + "."))]
    more = f" (and errors at {len(others)} more field(s))" if others else ""
    return path, " or ".join(by_path[path]) + more


def _invalid(path: str, problem: str) -> GatewayError:
    where = f"{path}: " if path else ""
    return GatewayError("invalid_request", f"Invalid request: {where}{problem}", param=path or None)


def validation_summary(exc: ValidationError, where: str = "") -> str:
    """`path: problem` of the first failing field, for messages about someone else's data."""
    path, problem = _first_problem(exc, where)
    return f"{path}: {problem}" if path else problem


def field_error(exc: ValidationError, where: str = "") -> GatewayError:
    """A 400 naming the first failing field's full path (`where` is the validated object's
    own path in the whole body)."""
    return _invalid(*_first_problem(exc, where))


def validate_at(model: type[M], data: Any, where: str) -> M:
    """Validate one nested object, reporting errors under its path in the whole body."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc, where) from exc


def bad_request(param: str, message: str) -> GatewayError:
    """A 400 about one field, worded like the validation errors."""
    return _invalid(param, message)


# --- bodies, headers, shared fields ------------------------------------------------------------


MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays and objects a body may have. Real requests (tool schemas
included) stay far below; deeper input would exhaust recursion in the JSON parser, in
pydantic's serializer when the call is recorded, or in a template's `tojson`."""

_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
"""Where a lone surrogate can come from: a `\\uD800`-style escape (raw UTF-8 bytes are
decoded strictly and cannot carry one) or a `str` body that already holds one."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def load_object(body: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """The request body as a JSON object; anything else is a 400.

    Bodies off the wire (bytes or str) must be UTF-8 JSON text whose strings are valid
    Unicode (no lone surrogates, which the tokenizer and the record writer cannot encode),
    whose numbers are finite (no `NaN`/`Infinity` literals, no `1e999`) and whose nesting
    is at most `MAX_JSON_DEPTH`. A Mapping is taken as already checked.
    """
    if isinstance(body, Mapping):
        return dict(body)
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GatewayError(
                "invalid_request", f"Request body is not valid UTF-8: {exc}"
            ) from exc
    else:
        text = body
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError as exc:
        raise _too_deep("") from exc
    except ValueError as exc:  # also covers JSONDecodeError
        raise GatewayError("invalid_request", f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise GatewayError("invalid_request", "Request body must be a JSON object")
    _check_tree(data, surrogates=_MAYBE_SURROGATE.search(text) is not None)
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"number {literal} is out of range")
    return value


def _too_deep(path: str) -> GatewayError:
    where = f" at {path}" if path else ""
    return GatewayError(
        "invalid_request",
        f"Request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels{where}",
        param=path or None,
    )


def _check_tree(data: dict[str, Any], *, surrogates: bool) -> None:
    """Depth limit, and (when the text may hold one) no lone surrogate in any key or string;
    iterative, so no input can exhaust the stack here. Errors name the field path."""
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(path)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            if surrogates and isinstance(key, str) and _SURROGATE.search(key):
                raise _lone_surrogate(path or "(top level)", f"key {key!r}")
            if isinstance(child, dict | list):
                stack.append((child, _child_path(path, key), depth + 1))
            elif surrogates and isinstance(child, str) and _SURROGATE.search(child):
                raise _lone_surrogate(_child_path(path, key), "text")


def _child_path(path: str, key: int | str) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _lone_surrogate(path: str, what: str) -> GatewayError:
    return _invalid(
        path,
        f"{what} contains a lone UTF-16 surrogate (e.g. an unpaired \\ud800 escape), "
        "which is not valid Unicode; send well-formed UTF-8 text",
    )


def clean_headers(
    headers: Mapping[str, str] | None, owned: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The client's headers without credentials and without the marker names in `owned`
    (those are computed by the adapter; a client cannot set them)."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if k.lower() not in CREDENTIAL_HEADERS and k.lower() not in owned
    }


def header_value(headers: Mapping[str, str] | None, name: str) -> str | None:
    """Case-insensitive header lookup; `name` is lower case."""
    for k, v in (headers or {}).items():
        if k.lower() == name:
            return v
    return None


def tool_choice_mode(choice: str) -> str:
    """A string `tool_choice`, checked to be one of `TOOL_CHOICE_MODES`."""
    if choice not in TOOL_CHOICE_MODES:
        raise bad_request(
            "tool_choice", f"must be 'none', 'auto', 'required' or an object, not {choice!r}"
        )
    return choice


def client_template_kwargs(
    values: Mapping[str, Any] | None, param: str = "chat_template_kwargs"
) -> dict[str, Any]:
    """A client's chat-template variables, refusing the names the renderer sets itself
    (`messages`, `add_generation_prompt`, ...): a 400 naming the key, not a crash."""
    out = dict(values or {})
    reserved = RESERVED_TEMPLATE_VARIABLES.intersection(out)
    if reserved:
        key = min(reserved)
        raise bad_request(
            f"{param}.{key}",
            f"{key!r} is set by the gateway's chat template renderer and cannot be passed; "
            f"reserved names: {', '.join(sorted(RESERVED_TEMPLATE_VARIABLES))}",
        )
    return out


def sampling_params(
    values: Mapping[str, Any], wire_names: Mapping[str, str] | None = None
) -> SamplingParams:
    """`SamplingParams` from a request's sampling fields (None means not sent).

    `wire_names` maps our field names to the protocol's (`max_tokens` → `max_output_tokens`)
    so that an out-of-range value is reported under the name the client sent.
    """
    try:
        return SamplingParams.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        path, problem = _first_problem(exc, "")
        root = re.split(r"[.\[]", path, maxsplit=1)[0]
        path = (wire_names or {}).get(root, root) + path[len(root) :]
        raise _invalid(path, problem) from exc
