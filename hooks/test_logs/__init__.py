"""Test-log parsers: a test runner's output → each test's status, by parser name.

Used by the `swebench` check to read which tests passed; `registry.register_parser`
adds one for another runner. `junit` reads pytest's JUnit XML report, which the check
prefers to pytest's log.
"""

from hooks.test_logs.base import STATUS_RANK, STATUSES, TestLogParser, TestStatus
from hooks.test_logs.registry import PARSERS, get_parser, register_parser

__all__ = [
    "PARSERS",
    "STATUSES",
    "STATUS_RANK",
    "TestLogParser",
    "TestStatus",
    "get_parser",
    "register_parser",
]
