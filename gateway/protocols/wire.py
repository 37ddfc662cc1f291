"""Reading JSON off the wire: the base models, body loading, field-path errors and headers
that every protocol adapter (and the engine client, for the engine's replies) shares.

Client requests are validated leniently about fields we ignore (SDKs, LangChain, Codex and
Claude Code send many) and strictly about the types of the fields we use. Every 400 names
the offending field path, e.g. `messages[2].content[0].text`, so a client author can fix it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway import json_text
from gateway.errors import GatewayError
from gateway.prompt.chat_template import RESERVED_TEMPLATE_VARIABLES
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


def load_object(body: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """The request body as a JSON object; anything else is a 400.

    Bodies off the wire (bytes, which must be UTF-8, or str) are checked by `parse_json`.
    A Mapping is taken as already checked.
    """
    if isinstance(body, Mapping):
        return dict(body)
    data = parse_json(body)
    if not isinstance(data, dict):
        raise GatewayError("invalid_request", "Request body must be a JSON object")
    return data


def parse_json(text: str | bytes, where: str = "Request body") -> Any:
    """JSON text from a client, or a 400 naming the offending field: see `json_text.loads`
    (no deep nesting, no lone surrogates, no NaN). `where` names the text in messages (the
    body, or a JSON string inside it)."""
    try:
        return json_text.loads(text)
    except json_text.UnsafeJsonError as exc:
        if exc.path:
            raise _invalid(exc.path, exc.problem) from exc
        raise GatewayError("invalid_request", f"{where}: {exc.problem}") from exc
    except UnicodeDecodeError as exc:
        raise GatewayError("invalid_request", f"{where} is not valid UTF-8: {exc}") from exc
    except ValueError as exc:  # JSONDecodeError, NaN and Infinity
        raise GatewayError("invalid_request", f"{where} is not valid JSON: {exc}") from exc


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
