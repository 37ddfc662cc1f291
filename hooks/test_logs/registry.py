"""Test-log parsers by name; `register_parser` adds one (a user's runner, a repo's own).

Names are matched case-blind, and SWE-bench-style function names are accepted for the
same parser (``parse_log_pytest`` is ``pytest``; SWE-rebench names its parser so).
"""

from __future__ import annotations

from hooks.test_logs.base import TestLogParser
from hooks.test_logs.pytest import PytestParser
from hooks.test_logs.unittest import UnittestParser

PARSERS: dict[str, TestLogParser] = {p.name: p for p in (PytestParser(), UnittestParser())}
#: Other names datasets use for a parser we have (`pytest_v2` differs only in stripping
#: colour codes, which every parser here does).
ALIASES = {"pytest_v2": "pytest", "django": "unittest"}


def _key(name: str) -> str:
    key = name.strip().lower()
    key = key.removeprefix("parse_log_")
    return ALIASES.get(key, key)


def register_parser(parser: TestLogParser, *, replace: bool = False) -> TestLogParser:
    """Make `parser` known by its `name`; a taken name needs `replace=True`."""
    key = _key(parser.name)
    if key in PARSERS and not replace:
        raise ValueError(f"a test-log parser named {key!r} is already registered")
    PARSERS[key] = parser
    return parser


def get_parser(name: str) -> TestLogParser:
    """The parser called `name`; a KeyError listing the known names if there is none."""
    try:
        return PARSERS[_key(name)]
    except KeyError:
        raise KeyError(
            f"unknown test-log parser {name!r}; known: {', '.join(sorted(PARSERS))}"
        ) from None
