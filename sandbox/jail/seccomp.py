"""The candidate's system-call filter: one table of denied calls, loaded through libseccomp.

A deny-list, not an allow-list: CUDA's driver makes ioctl, mmap and thread calls no one
lists ahead of time, so what is refused is what no kernel-writing program needs and what
widens the kernel surface or reaches past the jail: tracing and reading other processes,
kernel modules, BPF, performance counters, new namespaces (user namespaces included, which
an unprivileged user could otherwise make), mounts, keyrings, io_uring, the clock, handles
that bypass paths, sockets other than Unix ones, pushing input into a terminal, and
changing the parent-death signal the jail set. Refused calls fail with an errno (the
candidate's own code sees an OSError; nothing is killed for asking). Calls of another
architecture's ABI (32-bit entry points) kill the process: libseccomp's default for a
foreign architecture. The filter goes on last, after the harness has set itself up, on
every thread of the process, and is inherited by every child.

Loaded with `pyseccomp` (ctypes over libseccomp, the API of libseccomp's own binding).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

try:
    import pyseccomp as _seccomp
except (ImportError, OSError, RuntimeError) as _error:  # no libseccomp on this host
    _seccomp = None
    UNAVAILABLE = f"libseccomp not loadable: {_error}"
else:
    UNAVAILABLE = ""

_NE, _EQ, _MASKED_EQ = 1, 4, 7
_CLONE_NEW = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_PR_SET_PDEATHSIG = 1
_ADDR_NO_RANDOMIZE, _READ_IMPLIES_EXEC = 0x0040000, 0x0400000
_LOW_32 = 0xFFFFFFFF
_UNKNOWN_NAME = -1  # libseccomp's __NR_SCMP_ERROR


@dataclass(frozen=True)
class Rule:
    """Refuse `syscall` with `error`, when every (arg index, op, a, b) test holds.

    Ops are libseccomp's: for MASKED_EQ, `a` is the mask and `b` the value.
    """

    syscall: str
    error: int = errno.EPERM
    args: tuple[tuple[int, int, int, int], ...] = ()


_ALWAYS_DENIED = (
    # other processes' memory and execution
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    # the kernel itself
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "lookup_dcookie",
    "syslog",
    "uselib",
    "sysfs",
    "_sysctl",
    "ustat",
    "nfsservctl",
    "iopl",
    "ioperm",
    "vm86",
    "vm86old",
    "vhangup",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    # namespaces and mounts
    "unshare",
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "fanotify_init",
    # paths bypassed through file handles
    "open_by_handle_at",
    "name_to_handle_at",
    # keyrings
    "keyctl",
    "add_key",
    "request_key",
    # asynchronous I/O the filter cannot see into
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # the host's clock
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "stime",
    "adjtimex",
)

RULES: tuple[Rule, ...] = (
    *(Rule(name) for name in _ALWAYS_DENIED),
    # Unix sockets only (the grader's pipe); no other family, raw or netlink included.
    Rule("socket", errno.EAFNOSUPPORT, ((0, _NE, socket.AF_UNIX, 0),)),
    Rule("socketpair", errno.EAFNOSUPPORT, ((0, _NE, socket.AF_UNIX, 0),)),
    # No new namespace by clone; clone3 passes its flags in memory the filter cannot read,
    # so it answers "not implemented" and the C library falls back to clone.
    *(Rule("clone", errno.EPERM, ((0, _MASKED_EQ, flag, flag),)) for flag in _CLONE_NEW.values()),
    Rule("clone3", errno.ENOSYS),
    Rule("ioctl", errno.EPERM, ((1, _MASKED_EQ, _LOW_32, _TIOCSTI),)),
    Rule("ioctl", errno.EPERM, ((1, _MASKED_EQ, _LOW_32, _TIOCLINUX),)),
    # The parent-death signal is the jail's (nothing outlives the keeper of the job).
    Rule("prctl", errno.EPERM, ((0, _EQ, _PR_SET_PDEATHSIG, 0),)),
    Rule("personality", errno.EPERM, ((0, _MASKED_EQ, _ADDR_NO_RANDOMIZE, _ADDR_NO_RANDOMIZE),)),
    Rule("personality", errno.EPERM, ((0, _MASKED_EQ, _READ_IMPLIES_EXEC, _READ_IMPLIES_EXEC),)),
)


def apply(rules: tuple[Rule, ...] = RULES) -> list[str]:
    """Load the filter on every thread of this process; returns what could not be done.

    Calls this architecture lacks are skipped; names this libseccomp does not know at all
    (an old libseccomp on a new kernel) are reported.
    Needs no_new_privs (set by `sandbox.jail.identity`) or CAP_SYS_ADMIN.
    """
    if _seccomp is None:
        return [f"syscall filter ({UNAVAILABLE})"]
    native = _seccomp.system_arch()
    syscall_filter = _seccomp.SyscallFilter(_seccomp.ALLOW)
    syscall_filter.set_attr(_seccomp.Attr.CTL_TSYNC, 1)
    unknown = []
    for rule in rules:
        number = _seccomp.resolve_syscall(native, rule.syscall)
        if number == _UNKNOWN_NAME:
            unknown.append(rule.syscall)
        if number < 0:  # unknown, or a call this architecture does not have
            continue
        args = [_seccomp.Arg(index, op, a, b) for index, op, a, b in rule.args]
        syscall_filter.add_rule(_seccomp.ERRNO(rule.error), number, *args)
    syscall_filter.load()
    return [f"syscall filter: unknown here: {', '.join(unknown)}"] if unknown else []
