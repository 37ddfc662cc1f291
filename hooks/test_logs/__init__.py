"""Test-log parsers: a test runner's output → each test's status, by parser name.

Used by the `swebench` check to read which tests passed; `registry.register_parser`
adds one for another runner.
"""

from hooks.test_logs.base import STATUSES, TestLogParser, TestStatus
from hooks.test_logs.registry import PARSERS, get_parser, register_parser

__all__ = [
    "PARSERS",
    "STATUSES",
    "TestLogParser",
    "TestStatus",
    "get_parser",
    "register_parser",
]
