"""A finished call's reply as JSON bytes, written once by orjson.

Starlette's `JSONResponse` runs the stdlib encoder; orjson writes the same bytes for these
bodies (compact separators, non-ASCII text as UTF-8, the same string escapes) at a
fraction of the CPU. Only for bodies without floats: orjson spells some floats otherwise
(`0.00001` for `1e-05`) and writes `NaN` as `null`, where the stdlib encoder refuses it.
"""

from typing import Any

import orjson
from starlette.responses import Response


def json_reply(body: dict[str, Any]) -> Response:
    """A 200 `application/json` response of `body` (no floats in it)."""
    return Response(orjson.dumps(body), media_type="application/json")
