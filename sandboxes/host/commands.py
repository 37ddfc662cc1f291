"""Host commands a worker waits for, made to die with it, SIGKILL included.

`docker build` (a task's image) and `docker export | tar` (an image's rootfs) run from a
worker thread that waits for them. A worker killed with SIGKILL runs no cleanup: such a
command would run on to its end, parented to init, a build for up to its `timeout_s`.
Started with `preexec_fn=dies_with_this_thread()`, the command gets `PR_SET_PDEATHSIG`:
the kernel SIGKILLs it when the thread that started it exits. That thread is the one
blocked waiting for it, so in effect: when the worker dies. (The docker client going
away cancels the daemon's build.)

Sandboxes are not among them: they outlive a dead worker on purpose, recorded so that the
sandbox reaper removes them (`sandboxes/reaper.py`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
"""Looked up here, not in the child: between fork and exec only the call itself runs."""


def dies_with_this_thread() -> Callable[[], None] | None:
    """A `preexec_fn` for a command started and waited for by the calling thread: the
    command is SIGKILLed when that thread (with it, the process) is gone. None where the
    kernel has no such signal (the command then runs as before)."""
    if _prctl is None:
        return None
    prctl, starter = _prctl, os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != starter:  # the starter died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return arm
