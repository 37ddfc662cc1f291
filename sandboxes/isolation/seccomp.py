"""The seccomp filter of bubblewrap sandboxes (passed to ``bwrap --seccomp FD``).

Why: namespaces, dropped capabilities and ``--disable-userns`` already make most of
these calls fail, but every syscall the kernel still parses is attack surface (kernel
bugs in keyrings, bpf, io_uring, userfaultfd, perf and the mount API are the usual
escape routes). An agent running python, git, node and a shell never needs them, so
they answer EPERM before the kernel looks at their arguments.

The BPF program is compiled by libseccomp (Debian ``libseccomp2``) through
``pyseccomp``, a ctypes binding with libseccomp's own Python API: no hand-written
BPF. Default action: allow. Syscalls of another ABI (i386/x32 on x86-64) kill the
process, so a 32-bit syscall cannot sidestep the list. bwrap loads the filter right
before it execs the sandbox's first process, after its own mounts.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

#: Denied outright (EPERM): kernel/module/boot control, the mount API, keyrings,
#: bpf, perf, userfaultfd, io_uring, handle-based opens, ptrace and cross-process
#: memory access, namespace joins, swap, accounting, clock and raw port access.
DENIED_SYSCALLS: tuple[str, ...] = (
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "setns",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "uselib",
    "vhangup",
)

#: clone/unshare flags that create namespaces: denied (EPERM) when any is set.
NAMESPACE_FLAGS: dict[str, int] = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

#: personality() flags that weaken the memory layout or exec rules: denied when set
#: (a query, ``personality(0xffffffff)``, and plain PER_LINUX/PER_LINUX32 still work).
PERSONALITY_FLAGS: dict[str, int] = {
    "ADDR_NO_RANDOMIZE": 0x0040000,
    "FDPIC_FUNCPTRS": 0x0080000,
    "MMAP_PAGE_ZERO": 0x0100000,
    "ADDR_COMPAT_LAYOUT": 0x0200000,
    "READ_IMPLIES_EXEC": 0x0400000,
    "ADDR_LIMIT_32BIT": 0x0800000,
    "SHORT_INODE": 0x1000000,
    "WHOLE_SECONDS": 0x2000000,
    "STICKY_TIMEOUTS": 0x4000000,
    "ADDR_LIMIT_3GB": 0x8000000,
}
_QUERY_BIT = 0x80000000  # set only in the query value 0xffffffff, never a real flag


class SeccompUnavailable(RuntimeError):
    """libseccomp or its Python binding is missing: no filter can be built."""


def _lib() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as e:
        raise SeccompUnavailable(
            "the bwrap seccomp filter needs libseccomp (apt-get install libseccomp2, see "
            f"scripts/install_local_deps.sh) and the pyseccomp package ({e})"
        ) from e
    return pyseccomp


@functools.cache
def sandbox_filter_bpf() -> bytes:
    """The compiled BPF program (native architecture), built once per process."""
    sc = _lib()
    eperm = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    arch = sc.system_arch()
    for name in DENIED_SYSCALLS:
        # A name libseccomp cannot resolve here (e.g. iopl on arm64) does not exist
        # on this architecture: nothing to deny.
        if sc.resolve_syscall(arch, name) >= 0:
            f.add_rule(eperm, name)
    for flag in NAMESPACE_FLAGS.values():
        for call in ("unshare", "clone"):
            f.add_rule(eperm, call, sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes libc
    # fall back to clone(), whose flags are checked above.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in PERSONALITY_FLAGS.values():
        f.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, flag | _QUERY_BIT, flag))
    with tempfile.TemporaryFile() as t:
        f.export_bpf(t)
        t.seek(0)
        return t.read()
