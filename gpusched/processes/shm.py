"""Each job's own shared memory: a private /dev/shm and IPC namespace that go with the job.

Files in a shared /dev/shm outlive the processes that wrote them, and their pages stay
charged to the service's memory cgroup until someone deletes them: one job writing
680 MiB there and exiting left the daemon and every other job to be OOM-killed, with
no process of the job left to blame. So the supervisor, as root and before it starts the
job, enters a mount namespace of its own (mounts from the host still propagate into it:
it is a slave of the host's) and mounts a fresh tmpfs on /dev/shm, which the job
inherits. The supervisor unmounts it once the job's whole tree has stopped, which frees
its pages at once; were the supervisor killed, the namespace (and the tmpfs with it)
goes when its last process exits.

The same `unshare` gives the job an IPC namespace of its own: a SysV segment (or a POSIX
message queue) a job creates and never removes outlives every process of it, and in the
host's namespace it stayed, charged to the service and held by no process, across every
daemon restart until root ran `ipcrm`. In the job's namespace it is destroyed with the
namespace, once the supervisor, its last process, exits; `release_shm` removes the
segments at once.

`JOB_SHM_SIZE`: the tmpfs's size cap, the kernel's default for one (half of the
machine's memory): data loaders that pass batches through shared memory need room,
and the service's `MemoryMax=` bounds it anyway (the pages are charged to the job's
cgroup, docs/operations.md, "Memory and cgroups").
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

JOB_SHM_SIZE = "50%"
SHM_DIR = b"/dev/shm"

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_IPC_RMID = 0
SYSV_SHM = "/proc/sysvipc/shm"  # the segments of the caller's IPC namespace
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19
_MNT_DETACH = 2


def _libc() -> ctypes.CDLL:
    # The process's own symbols, libc's among them: not ctypes.util.find_library("c"),
    # which runs `ldconfig -p` (a subprocess, several ms) at every call, twice a job.
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def private_shm(size: str = JOB_SHM_SIZE) -> None:
    """Give this process (and what it starts) a new, empty /dev/shm and IPC namespace.
    Raises OSError where it cannot (not root, no namespaces): the job then shares the
    host's."""
    if not os.path.isdir(SHM_DIR):
        raise OSError(2, "no /dev/shm")
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC), "unshare(CLONE_NEWNS|CLONE_NEWIPC)")
    # A slave: our mounts never reach the host, the host's (an NFS mount) still reach us.
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
    options = f"mode=1777,size={size}".encode()
    _check(
        libc.mount(b"tmpfs", SHM_DIR, b"tmpfs", _MS_NOSUID | _MS_NODEV, options),
        "mount tmpfs on /dev/shm",
    )


def release_shm() -> None:
    """Unmount the job's /dev/shm (its pages are freed once no process holds a file) and
    remove its SysV segments (freed at once: none of its processes is left attached).
    Only in the job's own namespaces, once `private_shm` succeeded: elsewhere these are
    the host's."""
    libc = _libc()
    libc.umount2(SHM_DIR, _MNT_DETACH)
    try:
        lines = Path(SYSV_SHM).read_text().splitlines()[1:]
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) > 1 and fields[1].isdigit():
            libc.shmctl(int(fields[1]), _IPC_RMID, None)
