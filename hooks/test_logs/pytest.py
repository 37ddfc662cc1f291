"""pytest's output: the `-rA` short summary and the `-v` progress lines.

Summary lines put the status first (``PASSED tests/t.py::test_a``, ``FAILED
tests/t.py::test_b - AssertionError``; a collection error names the file,
``ERROR tests/t.py - ImportError``); progress lines put it after the node id
(``tests/t.py::test_a PASSED  [ 50%]``, or ``[gw0] [ 50%] PASSED tests/t.py::test_a``
under xdist). A parametrised id may hold spaces (``test_c[a b]``): it ends at the first
``]`` followed by the end of the line or the `` - `` before a message. ``SKIPPED [2]
t.py:10: reason`` names no test and is skipped.
"""

from __future__ import annotations

import re

from hooks.test_logs.base import STATUSES, TestStatus, plain_lines

_STATUS = "|".join(STATUSES)
_STATUS_FIRST = re.compile(rf"^({_STATUS}) (\S.*)$")
_STATUS_LAST = re.compile(rf"^(\S.*?) ({_STATUS})(?:\s+\[\s*\d+%\])?$")
_XDIST_PREFIX = re.compile(r"^\[gw\d+\] \[\s*\d+%\] ")


def _node_id(rest: str) -> str | None:
    """The node id at the start of `rest` (a summary line after its status word)."""
    test = rest.find("::")
    bracket = rest.find("[", test) if test >= 0 else -1
    if bracket >= 0 and " " not in rest[:bracket]:
        ends = [bracket + m.end() for m in re.finditer(r"\]", rest[bracket:])]
        for end in ends:  # the message follows " - " (or nothing does)
            if end == len(rest) or rest.startswith(" - ", end):
                return rest[:end]
        for end in ends:  # older pytest: "XPASS t.py::test[a] reason"
            if rest.startswith(" ", end):
                return rest[:end]
        return None
    word = rest.split(" ", 1)[0]
    return word if "::" in word or word.endswith(".py") else None


class PytestParser:
    name = "pytest"

    def parse(self, log: str) -> dict[str, TestStatus]:
        found: dict[str, TestStatus] = {}
        for line in plain_lines(log):
            line = _XDIST_PREFIX.sub("", line)
            first = _STATUS_FIRST.match(line)
            if first:
                node = _node_id(first.group(2))
                if node is not None:
                    found[node] = first.group(1)  # type: ignore[assignment]
                continue
            last = _STATUS_LAST.match(line)
            if last and "::" in last.group(1):
                found[last.group(1)] = last.group(2)  # type: ignore[assignment]
        return found
