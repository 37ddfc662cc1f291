"""What a test-log parser is: the runner's whole output in, test name → status out."""

from __future__ import annotations

import re
from typing import Literal, Protocol

#: A test's status as a parser reports it (MISSING is the grader's: not in the log).
TestStatus = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"]
STATUSES: tuple[TestStatus, ...] = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
#: How bad a status is: the worst wins where one test has several.
STATUS_RANK = {"PASSED": 0, "XPASS": 0, "XFAIL": 0, "SKIPPED": 1, "FAILED": 2, "ERROR": 3}

#: Terminal colour and cursor sequences (a runner forced into colour output).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class TestLogParser(Protocol):
    """Reads one run's combined stdout and stderr.

    A test seen more than once gets its last status (a rerun, or the summary after the
    progress lines). Lines that are not results are skipped: a parser never raises for
    output it does not understand, it just finds fewer tests.
    """

    name: str

    def parse(self, log: str) -> dict[str, TestStatus]: ...


def plain_lines(log: str) -> list[str]:
    """The log's lines without colour codes or trailing space."""
    return [line.rstrip() for line in _ANSI.sub("", log).splitlines()]
