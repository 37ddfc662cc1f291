"""Run a command whose whole process group dies with the process that started it.

`rollout demo` (and tests and benches) start vLLM, the Temporal dev server and the
trainer as process groups of their own, so that stopping one kills its workers too. If
the starter is killed with SIGKILL, nothing stops them: they would run on, parented to
init (a leaked vLLM holds gigabytes). Started as `tethered(argv)`, the command runs under
this small shim, which leads the group and watches the starter; when the starter exits,
however it exits, the shim SIGKILLs the group, itself included.

The starter is watched through a pidfd of its process (readable once it has exited), not
`PR_SET_PDEATHSIG`: that fires when the *thread* that forked exits, and starters fork
from worker threads too. Where pidfds are missing the shim polls its parent pid. The
command itself gets `PR_SET_PDEATHSIG` from the shim (single-threaded when it forks), so
it dies even if only the shim is killed.

Stopping stays as it was: signal the group (`os.killpg(proc.pid, ...)`); the shim ignores
SIGTERM/SIGINT/SIGHUP itself (the command gets them from the group signal) and exits with
the command's status once it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def tethered(argv: list[str]) -> list[str]:
    """`argv` run so that its process group dies with this process (the group's id is
    the pid of the process started from the returned argv)."""
    return [sys.executable, "-m", "devstack.tether", str(os.getpid()), "--", *argv]


def _die_with_shim() -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _kill_group() -> None:
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _watch(parent: int) -> None:
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(parent)
    if pidfd is not None and os.getppid() == parent:
        select.select([pidfd], [], [])  # opened while it was our parent: it is that process
    else:
        while os.getppid() == parent:
            time.sleep(0.5)
    _kill_group()


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m devstack.tether PARENT_PID -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent, command = int(args[0]), args[2:]
    with contextlib.suppress(PermissionError):  # already a group leader: started so
        os.setsid()
    if os.getppid() != parent:  # the starter died before we got here
        _kill_group()
    # Forked from this single-threaded shim's main thread, so the signal follows the shim:
    # a shim killed alone (not its group) still takes the command with it.
    child = subprocess.Popen(command, preexec_fn=_die_with_shim)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # the group's signal reaches the command
    threading.Thread(target=_watch, args=(parent,), daemon=True).start()
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
