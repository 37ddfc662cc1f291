"""pytest's JUnit XML report read into test statuses, checked against pytest's own log.

A real pytest run (the venv's) over a project with every outcome: the statuses read from
its `--junitxml` report, looked up by the node ids its `-rA` log names, must be the
statuses the log parser reads from that log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hooks.swebench_check import grade, lookup
from hooks.test_logs import get_parser
from hooks.test_logs.junit import (
    MAX_JUNIT_BYTES,
    JunitReportError,
    junit_address,
    parse_junit,
)

TESTS = """\
import pytest


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup")


def test_pass():
    pass


def test_fail():
    assert 1 == 2


def test_setup_error(broken_setup):
    pass


def test_teardown_error(broken_teardown):
    pass


def test_skip():
    pytest.skip("no")


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert 0


@pytest.mark.xfail(reason="known")
def test_xpass():
    pass


@pytest.mark.xfail(reason="known", strict=True)
def test_xpass_strict():
    pass


@pytest.mark.parametrize("x", ["a b", "c::d", "e[f]", "g.h/i"])
def test_param(x):
    assert x != "c::d"


class TestBox:
    def test_in_class(self):
        pass

    class TestInner:
        def test_nested(self):
            assert False
"""


@pytest.fixture(scope="module")
def pytest_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    """(the -rA log, the JUnit report) of one real pytest run."""
    root = tmp_path_factory.mktemp("proj")
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "sub" / "test_all.py").write_text(TESTS)
    (root / "test_broken.py").write_text("import no_such_module_here\n")
    report = root / "out" / "report.xml"
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONSAFEPATH": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    args = ["-rA", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *args, f"--junitxml={report}", "pkg", "test_broken.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    return res.stdout, report.read_bytes()


def test_the_report_gives_the_logs_statuses(pytest_run: tuple[str, bytes]) -> None:
    log, xml = pytest_run
    from_log = get_parser("pytest").parse(log)
    from_xml = parse_junit(xml)
    # Every outcome is there (a node id per test; the collection error by its file),
    # except that `-rA` names no skipped test ("SKIPPED [1] file:line: reason"): the
    # report does.
    t = "pkg/sub/test_all.py"
    assert set(from_log.values()) == {"PASSED", "FAILED", "ERROR", "XFAIL", "XPASS"}
    assert len(from_log) == 14 and len(from_xml) == 15
    assert f"{t}::test_skip" not in from_log
    assert lookup(junit_address(f"{t}::test_skip"), from_xml) == "SKIPPED"
    for node_id, status in from_log.items():
        # pytest's report writes a non-strict XPASS as a pass (no child element).
        want = "PASSED" if status == "XPASS" else status
        assert lookup(junit_address(node_id), from_xml) == want, node_id
    expected = {
        f"{t}::test_teardown_error": "ERROR",
        f"{t}::test_xpass_strict": "FAILED",
        f"{t}::test_param[c::d]": "FAILED",
        f"{t}::test_param[g.h/i]": "PASSED",
        f"{t}::TestBox::TestInner::test_nested": "FAILED",
        "test_broken.py": "ERROR",
    }
    assert {n: lookup(junit_address(n), from_xml) for n in expected} == expected


def test_grading_from_the_report_matches_grading_from_the_log(
    pytest_run: tuple[str, bytes],
) -> None:
    log, xml = pytest_run
    t = "pkg/sub/test_all.py"
    f2p = [f"{t}::test_pass", f"{t}::test_param[a", f"{t}::test_xfail", f"{t}::test_fail"]
    p2p = [f"{t}::test_skip", f"{t}::TestBox::test_in_class", f"{t}::test_gone"]
    failing, tests, _ = grade(parse_junit(xml), f2p, p2p, key=junit_address)
    log_failing, log_tests, _ = grade(get_parser("pytest").parse(log), f2p, p2p)
    assert failing == [f"{t}::test_fail", f"{t}::test_gone"]
    # The same verdict per test, but for the skipped one the log does not name.
    assert log_failing == [f"{t}::test_fail", f"{t}::test_skip", f"{t}::test_gone"]
    assert log_tests == {**tests, f"{t}::test_skip": "MISSING"}
    assert tests[f"{t}::test_skip"] == "SKIPPED" and tests[f"{t}::test_param[a"] == "PASSED"


@pytest.mark.parametrize(
    ("node_id", "address"),
    [
        ("tests/test_a.py::test_x", "tests.test_a::test_x"),
        ("tests/test_a.py::C::D::test_x[1-a b]", "tests.test_a.C.D::test_x[1-a b]"),
        ("t.py::test_x[a::b/c.py]", "t::test_x[a::b/c.py]"),
        ("tests/test_a.py", "::tests.test_a"),
    ],
)
def test_junit_address_is_how_pytest_names_a_test(node_id: str, address: str) -> None:
    assert junit_address(node_id) == address


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (
            b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaa">'
            b'<!ENTITY b "&a;&a;&a;&a;">]><testsuites><testcase classname="x" name="&b;"/>'
            b"</testsuites>",
            "declares an XML entity",
        ),
        (
            b'<!DOCTYPE t [<!ENTITY e SYSTEM "file:///etc/passwd">]><testsuites>&e;</testsuites>',
            "declares an XML entity",
        ),
        (b"<testsuites><testcase", "not well-formed"),
        (b'<html><testcase classname="x" name="y"/></html>', "root element is <html>"),
        (b" " * (MAX_JUNIT_BYTES + 1), "over the"),
    ],
)
def test_a_report_we_cannot_trust_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(JunitReportError, match=why):
        parse_junit(data)


def test_a_test_written_twice_gets_its_worst_status() -> None:
    xml = (
        b'<testsuites><testsuite><testcase classname="t" name="a"><failure message="x"/>'
        b'</testcase><testcase classname="t" name="a"/><testcase classname="t" name="b">'
        b'<skipped type="pytest.xfail" message="m"/><system-out>out</system-out></testcase>'
        b"</testsuite></testsuites>"
    )
    assert parse_junit(xml) == {"t::a": "FAILED", "t::b": "XFAIL"}


def test_an_empty_report_has_no_test(tmp_path: Path) -> None:
    assert parse_junit(b'<testsuites><testsuite name="pytest" tests="0"/></testsuites>') == {}
