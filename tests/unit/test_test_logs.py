"""Test-log parsers and SWE-bench grading on logs shaped like the runners' real output."""

from __future__ import annotations

import pytest

from hooks.swebench_check import grade, lookup
from hooks.test_logs import get_parser, register_parser
from hooks.test_logs.base import TestStatus
from hooks.test_logs.registry import PARSERS

PYTEST_RA = """\
============================= test session starts ==============================
platform linux -- Python 3.11.2, pytest-7.2.1, pluggy-1.0.0
rootdir: /testbed
collected 7 items

tests/test_calc.py ..F.sx                                                  [ 85%]
tests/test_fmt.py E                                                        [100%]

==================================== ERRORS ====================================
________________________ ERROR at setup of test_render _________________________
file /testbed/tests/test_fmt.py, line 3
E       fixture 'tmp_dir' not found
=================================== FAILURES ===================================
_____________________________ test_divide[by zero] _____________________________
    def test_divide(case):
>       assert divide(1, 0) is None
E       ZeroDivisionError: division by zero
PASSED tests/test_calc.py::test_add
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_add
PASSED tests/test_calc.py::test_divide[one two]
FAILED tests/test_calc.py::test_divide[by zero] - ZeroDivisionError: division by zero
PASSED tests/test_calc.py::TestCalc::test_sub
SKIPPED [1] tests/test_calc.py:40: needs numpy
XFAIL tests/test_calc.py::test_round - known bug
ERROR tests/test_fmt.py::test_render
ERROR tests/test_broken.py - ImportError: cannot import name 'x'
============= 1 failed, 3 passed, 1 skipped, 1 xfailed, 2 errors in 0.12s =============
"""


def test_pytest_short_summary() -> None:
    found = get_parser("pytest").parse(PYTEST_RA)
    assert found == {
        "tests/test_calc.py::test_add": "PASSED",
        "tests/test_calc.py::test_divide[one two]": "PASSED",
        "tests/test_calc.py::test_divide[by zero]": "FAILED",
        "tests/test_calc.py::TestCalc::test_sub": "PASSED",
        "tests/test_calc.py::test_round": "XFAIL",
        "tests/test_fmt.py::test_render": "ERROR",
        "tests/test_broken.py": "ERROR",
    }


def test_pytest_verbose_lines_colour_and_xdist() -> None:
    log = (
        "tests/test_calc.py::test_add PASSED                                [ 33%]\n"
        "\x1b[32mtests/test_calc.py::test_mul[2 x 3] PASSED\x1b[0m          [ 66%]\n"
        "tests/test_calc.py::test_div FAILED                                [100%]\n"
        "[gw1] [ 50%] SKIPPED tests/test_calc.py::test_pow\n"
        "tests/test_calc.py::test_mod XPASS\n"
    )
    assert get_parser("pytest").parse(log) == {
        "tests/test_calc.py::test_add": "PASSED",
        "tests/test_calc.py::test_mul[2 x 3]": "PASSED",
        "tests/test_calc.py::test_div": "FAILED",
        "tests/test_calc.py::test_pow": "SKIPPED",
        "tests/test_calc.py::test_mod": "XPASS",
    }


def test_pytest_later_status_wins_and_prose_is_skipped() -> None:
    log = (
        "tests/t.py::test_a FAILED\n"
        "PASSED is a word this test printed\n"
        "FAILED (errors=1)\n"
        "PASSED tests/t.py::test_a\n"
    )
    assert get_parser("pytest").parse(log) == {"tests/t.py::test_a": "PASSED"}


UNITTEST_V = """\
test_add (test_calc.TestCalc.test_add) ... ok
test_div (test_calc.TestCalc.test_div) ... FAIL
test_mul (test_calc.TestCalc.test_mul) ... ERROR
test_pow (test_calc.TestCalc.test_pow) ... skipped 'not yet'
test_round (test_calc.TestCalc.test_round) ... expected failure
test_sqrt (test_calc.TestCalc.test_sqrt)
Square roots of perfect squares. ... ok
test_noisy (test_calc.TestCalc) ... printing something
ok
test_sub (test_calc.TestCalc) ... unexpected success

======================================================================
FAIL: test_div (test_calc.TestCalc.test_div)
----------------------------------------------------------------------
Traceback (most recent call last):
AssertionError: 2 != 3

----------------------------------------------------------------------
Ran 8 tests in 0.002s

FAILED (failures=1, errors=1, skipped=1, expected failures=1)
"""


def test_unittest_verbose() -> None:
    assert get_parser("unittest").parse(UNITTEST_V) == {
        "test_add (test_calc.TestCalc.test_add)": "PASSED",
        "test_div (test_calc.TestCalc.test_div)": "FAILED",
        "test_mul (test_calc.TestCalc.test_mul)": "ERROR",
        "test_pow (test_calc.TestCalc.test_pow)": "SKIPPED",
        "test_round (test_calc.TestCalc.test_round)": "XFAIL",
        "test_sqrt (test_calc.TestCalc.test_sqrt)": "PASSED",
        "test_noisy (test_calc.TestCalc)": "PASSED",
        "test_sub (test_calc.TestCalc)": "XPASS",
    }


def test_registry_names_aliases_and_user_parsers() -> None:
    assert get_parser("parse_log_pytest") is get_parser("pytest")
    assert get_parser("Django") is get_parser("unittest")
    with pytest.raises(KeyError, match=r"unknown test-log parser 'tap'.*pytest"):
        get_parser("tap")

    class Tap:
        name = "tap"

        def parse(self, log: str) -> dict[str, TestStatus]:
            return {ln[3:]: "PASSED" for ln in log.splitlines() if ln.startswith("ok ")}

    try:
        register_parser(Tap())
        assert get_parser("parse_log_tap").parse("ok 1 a\nnot ok 2 b") == {"1 a": "PASSED"}
        with pytest.raises(ValueError, match="already registered"):
            register_parser(Tap())
    finally:
        PARSERS.pop("tap", None)


def test_grade_is_swebench_resolved_rule() -> None:
    found: dict[str, TestStatus] = {
        "t.py::f2p_a": "PASSED",
        "t.py::f2p_b": "XFAIL",
        "t.py::p2p_a": "PASSED",
        "t.py::p2p_b": "SKIPPED",
    }
    failing, tests, counts = grade(
        found, ["t.py::f2p_a", "t.py::f2p_b"], ["t.py::p2p_a", "t.py::p2p_b"]
    )
    assert failing == [] and tests["t.py::p2p_b"] == "SKIPPED"
    assert counts == {
        "fail_to_pass_passed": 2.0,
        "fail_to_pass_total": 2.0,
        "pass_to_pass_passed": 2.0,
        "pass_to_pass_total": 2.0,
    }
    # A skipped FAIL_TO_PASS test and a missing one fail; so does a failed PASS_TO_PASS.
    found2: dict[str, TestStatus] = {"t.py::f2p_a": "SKIPPED", "t.py::p2p_a": "FAILED"}
    failing, tests, counts = grade(found2, ["t.py::f2p_a", "t.py::gone"], ["t.py::p2p_a"])
    assert failing == ["t.py::f2p_a", "t.py::gone", "t.py::p2p_a"]
    assert tests == {"t.py::f2p_a": "SKIPPED", "t.py::gone": "MISSING", "t.py::p2p_a": "FAILED"}
    assert counts["fail_to_pass_passed"] == 0 and counts["pass_to_pass_total"] == 1


def test_lookup_matches_swebench_names_cut_at_a_space() -> None:
    found: dict[str, TestStatus] = {"t.py::test_c[a b]": "PASSED", "t.py::test_c[a c]": "FAILED"}
    assert lookup("t.py::test_c[a b]", found) == "PASSED"
    assert lookup("t.py::test_c[a", found) == "FAILED"  # the worst of the two it stands for
    assert lookup("t.py::test_c[x", found) == "MISSING"
