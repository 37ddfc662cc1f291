"""The chaos run's overlap check: which fuzz requests went out while a part was down."""

from stress.chaos import Fault, FaultRecord, Report, sent_during


def _report(fuzz_sent: int) -> Report:
    fault = FaultRecord(
        fault=Fault.engine,
        target="engine",
        at_done=3,
        killed_at_s=10.0,
        back_at_s=13.0,
        fuzz_sent=fuzz_sent,
    )
    return Report.model_validate(
        {
            **dict.fromkeys(["n", "wall_s", "multi_attempt", "samples", "sampled_turns"], 1),
            **dict.fromkeys(["duplicated", "tokens_differ", "turns_missing"], 0),
            **dict.fromkeys(["sandboxes_left", "sandbox_processes_left", "sessions_left"], 0),
            **dict.fromkeys(["fuzz_during_faults", "fuzz_seconds", "fuzz_5xx"], 0),
            **dict.fromkeys(["fuzz_5xx_engine_down", "fuzz_bad_shape"], 0),
            "statuses": {"ok": 1},
            "lost": [],
            "failed": [],
            "gave_up": [],
            "attempts_in_history": True,
            "fuzz_requests": {"openai_chat": 100},
            "fuzz_error": None,
            "witnesses_unchanged": True,
            "faults": [fault],
        }
    )


def test_requests_in_the_window_are_counted_edges_included() -> None:
    assert sent_during([1.0, 2.0, 2.5, 3.0, 4.0], 2.0, 3.0) == 3


def test_a_fuzzer_that_finished_before_the_fault_overlapped_nothing() -> None:
    """Control: what the e2e test would see had the fuzzing ended before the kill."""
    assert sent_during([1.0, 2.0, 5.0], 10.0, 13.0) == 0


def test_a_fault_no_fuzz_request_overlapped_is_a_problem() -> None:
    assert _report(fuzz_sent=0).problems() == [
        "no fuzz request sent while these were down: ['engine']"
    ]
    assert _report(fuzz_sent=7).problems() == []
