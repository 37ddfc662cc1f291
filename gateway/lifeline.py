"""A helper process that must not outlive the process that started it, SIGKILL included.

A gateway killed with SIGKILL runs no cleanup: a process it started (a tokenizer-pool
worker, a gateway process under `--processes N`) would live on, parented to init. So
each such child calls `die_with_parent` first thing. Two mechanisms, because each alone
has a gap:

- `PR_SET_PDEATHSIG` (Linux): the kernel sends SIGKILL the instant the parent dies, even
  while this process holds the GIL in a long encode. But it fires when the *thread* that
  forked this process exits, not the process: it is set only when the parent says that
  thread is its main thread (which lives as long as the process).
- A watcher thread on a pidfd of the parent *process* (`os.pidfd_open`, readable once it
  has exited): exact whatever thread forked, and the only one where prctl is not there.

Either way the child is SIGKILLed, so it does only what survives that (no cleanup). What
its own children do is theirs: a pool worker starts none; the multiprocessing resource
tracker of a gateway exits by itself once every holder of its pipe (the gateway and its
pool workers) is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time

#: Environment variable naming the parent a child of `rollout gateway --processes N`
#: watches (its pid, then `:main` when it was started from the parent's main thread).
PARENT_ENV = "ROLLOUT_PARENT_LIFELINE"

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


def parent_token() -> str:
    """What a parent gives a child to watch it (`PARENT_ENV`, or initializer args)."""
    main = threading.current_thread() is threading.main_thread()
    return f"{os.getpid()}:main" if main else str(os.getpid())


def die_with_parent(token: str) -> None:
    """Make this process die when the parent named by `token` (`parent_token`) does."""
    pid_text, _, where = token.partition(":")
    parent = int(pid_text)
    if where == "main" and sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    threading.Thread(target=_watch, args=(parent,), name="lifeline", daemon=True).start()


def _watch(parent: int) -> None:
    """Block until `parent` is gone, then SIGKILL this process."""
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(parent)
    if os.getppid() == parent and pidfd is not None:
        # Opened while it is still our parent, so the fd names it (never a reused pid).
        select.select([pidfd], [], [])
    else:
        while os.getppid() == parent:  # no pidfd (old kernel): the parent changes on exit
            time.sleep(_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def from_environment() -> None:
    """`die_with_parent` for a process started with `PARENT_ENV` set; else nothing."""
    token = os.environ.pop(PARENT_ENV, None)
    if token:
        die_with_parent(token)
