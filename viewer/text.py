"""Making recorded text safe to show: control characters made visible, long text clipped.

Autoescaping (Jinja2) keeps HTML inert; this keeps a terminal escape or a megabyte line
from wrecking the page's layout or its load time.
"""

import re

#: Characters of one text field shown before it is clipped.
CLIP_CHARS = 20_000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with control characters (but newline and tab) shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clip(text: str, limit: int = CLIP_CHARS, *, keep: str = "head") -> str:
    """At most `limit` characters of `text` (its head or its tail), saying what was cut."""
    if len(text) <= limit:
        return visible(text)
    cut = len(text) - limit
    if keep == "tail":
        return f"[… {cut:,} characters clipped]\n" + visible(text[-limit:])
    return visible(text[:limit]) + f"\n[… {cut:,} characters clipped]"
