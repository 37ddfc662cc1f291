"""pytest's JUnit XML report (``--junitxml``) → each test's status.

The report names a test by ``classname`` and ``name``, which pytest derives from the
node id (its `mangle_test_address`): the file path dotted without ``.py``, then the
classes, then the function with its parameters, ``tests/t.py::C::test_a[x-1]`` →
``tests.t.C`` + ``test_a[x-1]``. That cannot be turned back into a node id (a dot may
be a directory or a class), so the report is keyed by that address and a listed node id
is mapped the same way (`junit_address`) to be looked up in it.

The file is written by a process the code under test runs in: it is read with a size
cap, by expat with every entity declaration refused (no expansion, no external
entity), and only the ``<testcase>`` elements and their direct children are looked at.
"""

from __future__ import annotations

from xml.parsers import expat

from hooks.test_logs.base import STATUS_RANK, TestStatus

#: The largest report read (captured output can make it large; more is not graded).
MAX_JUNIT_BYTES = 64 * 1024 * 1024
_XPASS_MESSAGE = "xfail-marked test passes unexpectedly"


class JunitReportError(ValueError):
    """The report is not a JUnit XML report we can read."""


def junit_address(node_id: str) -> str:
    """The report's key (``classname::name``) of a pytest node id, as pytest writes it."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    names[-1] += bracket + params
    return "::".join((".".join(names[:-1]), names[-1]))


def _status(children: dict[str, dict[str, str]]) -> TestStatus:
    """A test case's status from its child elements (none of these: it passed)."""
    if "error" in children:
        return "ERROR"
    if "failure" in children:
        return "FAILED"
    skipped = children.get("skipped")
    if skipped is None:
        return "PASSED"
    if skipped.get("type") == "pytest.xfail":
        return "XFAIL"
    return "XPASS" if skipped.get("message") == _XPASS_MESSAGE else "SKIPPED"


def parse_junit(data: bytes) -> dict[str, TestStatus]:
    """Each test case's status by `junit_address`; a test written more than once (a
    teardown error after a failure) gets its worst status."""
    if len(data) > MAX_JUNIT_BYTES:
        raise JunitReportError(f"the report is over the {MAX_JUNIT_BYTES}-byte cap")
    found: dict[str, TestStatus] = {}
    stack: list[str] = []
    case: tuple[str, dict[str, dict[str, str]]] | None = None

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal case
        if not stack and tag not in ("testsuites", "testsuite"):
            raise JunitReportError(f"the root element is <{tag}>, not <testsuites>")
        if tag == "testcase":
            case = (f"{attrs.get('classname', '')}::{attrs.get('name', '')}", {})
        elif case is not None and stack[-1] == "testcase":
            case[1].setdefault(tag, attrs)
        stack.append(tag)

    def end(tag: str) -> None:
        nonlocal case
        stack.pop()
        if tag == "testcase" and case is not None:
            key, status = case[0], _status(case[1])
            if key not in found or STATUS_RANK[status] > STATUS_RANK[found[key]]:
                found[key] = status
            case = None

    def no_entities(*_: object) -> None:
        raise JunitReportError("the report declares an XML entity")

    parser = expat.ParserCreate()
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.EntityDeclHandler = no_entities
    parser.UnparsedEntityDeclHandler = no_entities
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    try:
        parser.Parse(data, True)
    except expat.ExpatError as e:
        raise JunitReportError(f"not well-formed XML: {e}") from None
    return found
