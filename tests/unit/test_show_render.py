"""`rollout show` in the terminal and the run summary: what a person reads, and that a
rollout's recorded text (an agent's, a verifier's) cannot drive the terminal."""

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rollout_client.client import Batch, RolloutOutcome
from rollout_client.samples_reader import SamplesReader
from rollout_client.storage import write_table
from schemas.conversation import CallConversation, ConvMessage, ConvToolCall
from schemas.outcome import RolloutStatus
from schemas.rollout import RolloutResult
from schemas.samples import rows_to_table
from tests.unit.test_samples_reader import NOT_FOUND, _rows, eval_error_outcome, ok_outcome
from workers.cli import app
from workers.run_cmd import BatchReport, failure_reasons, print_show_line, print_summary
from workers.show_cmd import show_from_samples
from workers.show_render import LINE_CHARS, reply_brief, rollout_view, safe

HOSTILE = "\x1b[2J\x1b]0;owned\x07[bold red]markup[/] <script>alert(1)</script>\r\u202e"


def _console() -> Console:
    return Console(record=True, width=160, force_terminal=False, color_system=None)


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    detail = f"{'y' * 1_000_000}\n{HOSTILE}\n{NOT_FOUND}"
    for rid, task, outcome in (
        ("b1-hello-0", "hello", ok_outcome("/srv/worker/artifacts/b1-hello-0/attempt-1")),
        ("b1-py-0", "py", eval_error_outcome(detail)),
    ):
        rows = _rows(rid, "b1", task, outcome)
        write_table(rows_to_table(rows), str(tmp_path / "b1" / f"{rid}.parquet"))
    return tmp_path


def test_safe_shows_controls_as_escapes_and_clips_long_lines() -> None:
    shown = safe(HOSTILE)
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert "\u202e" not in shown  # a bidi override would reorder what follows it
    assert shown.startswith("\\x1b[2J\\x1b]0;owned\\x07[bold red]markup[/]")
    long = safe("z" * 1_000_000)
    assert long == "z" * LINE_CHARS + f"… (+{1_000_000 - LINE_CHARS} chars)"


def test_a_hostile_reason_and_detail_print_as_plain_clipped_text(samples: Path) -> None:
    console = _console()
    detail = SamplesReader(samples).rollout("b1-py-0")
    detail = detail.model_copy(update={"reason": f"{HOSTILE}\n{NOT_FOUND}"})
    console.print(rollout_view(detail))
    text = console.export_text()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "[bold red]markup[/]" in text  # printed, not read as markup
    assert NOT_FOUND in text and "earlier lines" not in text  # a 3-line detail, all shown
    assert "… (+" in text  # the megabyte line, clipped
    assert max(len(line) for line in text.splitlines()) <= 160


def test_show_a_rollout_says_why_with_its_check_and_steps(samples: Path) -> None:
    console = _console()
    show_from_samples(console, "b1-py-0", str(samples))
    text = console.export_text()
    assert "eval_error" in text and "the evaluator's failure" in text
    assert "check 'tests' could not run (exit 127)" in text  # the reason
    assert text.count(NOT_FOUND) >= 2  # in the reason and in the check's detail tail
    assert "tests (command)" in text and "127" in text
    console = _console()
    show_from_samples(console, "b1-hello-0", str(samples))
    text = console.export_text()
    assert "agent 3.25 s" in text and "evaluate 0.40 s" in text
    assert "verdict from junit-xml" in text and "\\x0a" not in text
    assert "pol-3" in text and "pol-4" in text and "4 trained tokens" in text
    assert "evaluation.json (evaluation) not looked" in text
    assert "give --artifacts WORKER_DATA_DIR" in text


def test_show_a_batch_groups_errors_and_names_a_failing_rollout(samples: Path) -> None:
    console = _console()
    show_from_samples(console, "b1", str(samples))
    text = console.export_text()
    assert "eval_error" in text and "hello" in text
    assert "check 'tests' could not run (exit 127)" in text
    assert f"a failing rollout: rollout show b1-py-0 --samples {samples}" in text


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["show", "b1", "--samples", "/nonexistent/x"], 2, "not a samples directory"),
        (["show", "nope", "--samples", "{samples}"], 1, "no rollout or batch 'nope'"),
    ],
)
def test_show_refuses_with_what_was_expected(
    samples: Path, args: list[str], code: int, says: str
) -> None:
    result = CliRunner().invoke(app, [a.format(samples=samples) for a in args])
    assert result.exit_code == code, result.output
    assert says in result.output


def _result(rid: str, status: RolloutStatus, error: str | None) -> RolloutResult:
    return RolloutResult(
        rollout_id=rid,
        batch_id="b1",
        task_id="t",
        group_id="b1-t",
        sample_index=0,
        status=status,
        reward=None if error else 1.0,
        harness="command",
        harness_version="1",
        policy_version="p",
        error=error,
    )


def test_the_run_summary_gives_each_failing_rollout_its_reason_and_the_show_line() -> None:
    batch = Batch(batch_id="b1", output="/out/b1", rollout_ids=[], groups={})
    report = BatchReport(
        batch,
        outcomes=[
            RolloutOutcome(
                rollout_id="b1-t-0",
                workflow_status="COMPLETED",
                result=_result("b1-t-0", RolloutStatus.ok, None),
            ),
            RolloutOutcome(
                rollout_id="b1-t-1",
                workflow_status="COMPLETED",
                result=_result("b1-t-1", RolloutStatus.eval_error, f"\n{NOT_FOUND}\nmore\x1b[31m"),
            ),
            RolloutOutcome(
                rollout_id="b1-t-2", workflow_status="FAILED", error="provision: no image\n…"
            ),
        ],
    )
    assert failure_reasons(report) == [
        ("b1-t-1", "eval_error", NOT_FOUND),
        ("b1-t-2", "failed", "provision: no image"),
    ]
    console = _console()
    print_summary(console, report)
    print_show_line(console, report, Path("/data/worker"))
    text = console.export_text()
    assert "eval_error" in text and NOT_FOUND in text and "eval_err…" not in text
    assert (
        text.splitlines()[-1] == "show: rollout show b1 --samples /out/b1 --artifacts /data/worker"
    )


def test_a_calls_reply_in_one_line() -> None:
    """Tool calls by name and arguments after the text; no conversation recorded: blank."""
    call = ConvToolCall(name="bash", arguments='{\n  "command": "ls"\n}', id="c1")
    said = CallConversation(
        history=0, reply=ConvMessage(role="assistant", content="Let me\nlook.", tool_calls=[call])
    )
    assert reply_brief(said) == 'Let me look. bash({ "command": "ls" })'
    assert reply_brief(CallConversation(history=2)) == "(no reply)"
    assert reply_brief(None) == ""
