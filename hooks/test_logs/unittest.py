"""unittest's verbose output (``python -m unittest -v``; Django's test runner too).

A result line is ``<test> ... <outcome>``; the test is named as the runner printed it,
``test_a (pkg.test_mod.Case.test_a)`` (Python 3.11+) or ``test_a (pkg.test_mod.Case)``
(older, and Django), which is how SWE-bench's Django instances list their tests. A test
with a docstring prints its name on one line and ``<docstring> ... <outcome>`` on the
next; output a test prints can push the outcome onto a later line of its own. The
``FAIL: <test>`` / ``ERROR: <test>`` headers of the failure report count too.
"""

from __future__ import annotations

import re

from hooks.test_logs.base import TestStatus, plain_lines

_NAME = re.compile(r"^\w+ \([\w.]+\)$")
_OUTCOMES: tuple[tuple[str, TestStatus], ...] = (
    ("ok", "PASSED"),
    ("FAIL", "FAILED"),
    ("ERROR", "ERROR"),
    ("skipped", "SKIPPED"),
    ("expected failure", "XFAIL"),
    ("unexpected success", "XPASS"),
)
_HEADER = re.compile(r"^(FAIL|ERROR): (\w+ \([\w.]+\))")


def _outcome(text: str) -> TestStatus | None:
    """The status `text` (what follows `` ... ``) starts with, if any."""
    for word, status in _OUTCOMES:
        if text == word or text.startswith(word + " "):
            return status
    return None


class UnittestParser:
    name = "unittest"

    def parse(self, log: str) -> dict[str, TestStatus]:
        found: dict[str, TestStatus] = {}
        previous = ""
        pending: str | None = None  # a test whose outcome has not been printed yet
        for line in plain_lines(log):
            header = _HEADER.match(line)
            if header:
                found[header.group(2)] = "FAILED" if header.group(1) == "FAIL" else "ERROR"
                pending = None
            elif " ... " in line:
                name, _, rest = line.partition(" ... ")
                if not _NAME.match(name) and _NAME.match(previous):
                    name = previous  # "<docstring> ... ok" under its test's name
                status = _outcome(rest.strip())
                if status is None:
                    pending = name
                else:
                    found[name], pending = status, None
            elif pending is not None and (status := _outcome(line.strip())) is not None:
                found[pending], pending = status, None
            previous = line
        return found
