"""One-time set-up steps of the demo, run with a progress line.

Creating the vLLM CPU environment, the trainer's overlay or the warm tiny model takes
minutes on a fresh machine, and the installers' output goes to a log file, not to the
terminal. Without a visible line a newcomer sees a frozen demo, so each step says what
it does, where its log is, and how long it has been running: a live status line on a
TTY, one plain line every `every_s` seconds without one (CI logs stay short).
"""

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _last_line(log: Path | None, width: int = 70) -> str:
    """The log's last non-empty line, shortened: what the installer is doing now."""
    if log is None or not log.is_file():
        return ""
    with log.open("rb") as fh:
        fh.seek(max(0, log.stat().st_size - 4096))
        lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
    last = next((ln for ln in reversed(lines) if ln), "")
    return last if len(last) <= width else last[: width - 1] + "…"


def run_step(
    console: "Console",
    what: str,
    work: Callable[[], T],
    log: Path | Callable[[], Path | None] | None,
    expect: str,
    every_s: float = 30.0,
) -> T:
    """Run `work` (blocking) in a thread while showing progress; returns its result or
    raises its exception. `log` may be a function when the file appears only later."""
    from rich.text import Text

    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    def log_path() -> Path | None:
        return log() if callable(log) else log

    started = time.monotonic()
    thread = threading.Thread(target=target, name=f"setup: {what}", daemon=True)
    thread.start()
    shown = log_path()
    where = f"log: {shown}" if shown else "log: (appears once it starts)"
    console.print(
        f"setup: {what} (first run only, {expect}); {where}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    if console.is_terminal:
        with console.status(what) as status:
            while thread.is_alive():
                thread.join(1.0)
                now = _last_line(log_path())
                status.update(Text(f"{what} … {_elapsed(time.monotonic() - started)}  {now}"))
    else:
        next_line = started + every_s
        while thread.is_alive():
            thread.join(1.0)
            if thread.is_alive() and time.monotonic() >= next_line:
                next_line += every_s
                now = _last_line(log_path())
                console.print(
                    f"setup: {what} … {_elapsed(time.monotonic() - started)}  {now}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
    if error:
        console.print(
            f"setup: {what} FAILED after {_elapsed(time.monotonic() - started)}", markup=False
        )
        raise error[0]
    final = log_path()
    console.print(
        f"setup: {what} done in {_elapsed(time.monotonic() - started)}"
        + (f" (log: {final})" if final and final != shown else ""),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return result[0]
