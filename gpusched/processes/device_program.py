"""cgroup v2 device fencing: a BPF device program that denies the other cards' nodes.

cgroup v2 has no `devices.deny` file. There the kernel asks every
`BPF_PROG_TYPE_CGROUP_DEVICE` program attached to the cgroup of the process opening (or
creating) a device node, and to its ancestors, and allows the access only if all of them
return 1 (systemd's `DeviceAllow=` works so). This module loads one such program per job,
denying the listed (major, minor) character devices and allowing everything else, and
attaches it with `BPF_F_ALLOW_MULTI` to the job's cgroup directory, so that programs
already attached above (systemd's) keep their say. The attachment holds the program: it
lives as long as the cgroup, and its file descriptor is closed at once.

The program, hand-assembled: each instruction is a little-endian `struct bpf_insn` of 8
bytes, `u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm`. Its context (r1) is a
`struct bpf_cgroup_dev_ctx`: `u32 access_type` at offset 0 (low 16 bits the type,
BPF_DEVCG_DEV_BLOCK 1 or BPF_DEVCG_DEV_CHAR 2; high 16 bits the access, mknod, read,
write), `u32 major` at 4, `u32 minor` at 8.

    r2 = *(u32 *)(r1 + 0); r2 &= 0xffff      the device type
    r3 = *(u32 *)(r1 + 4); r4 = *(u32 *)(r1 + 8)
    if r2 != 2 goto allow                     not a character device
    for each denied (M, m):
        if r3 != M goto +3; if r4 != m goto +2; r0 = 0; exit
    allow: r0 = 1; exit

Every access (read, write, mknod) to a denied node is refused, as `rwm` on cgroup v1.
Stdlib only (ctypes for the `bpf(2)` system call): the supervisor imports it at every
job's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # the attach type
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2
_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}

# Instruction codes: class | operation | source (linux/bpf_common.h, linux/bpf.h).
_LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_ALU64_AND_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K
_ALU64_MOV_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_JMP_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K
_JMP_EXIT = 0x95  # BPF_JMP | BPF_EXIT
_BLOCK = 4  # instructions per denied device
_MAX_DENIED = 8000  # keeps every jump offset well within its s16

_RULE = re.compile(r"^c (\d+):(\d+) [rwm]+$")


class ProgramError(OSError):
    """The kernel refused to load or attach the program."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def assemble(denied: Sequence[tuple[int, int]]) -> bytes:
    """The program denying each character device (major, minor) of `denied`."""
    if len(denied) > _MAX_DENIED:
        raise ValueError(f"too many device nodes to deny ({len(denied)})")
    code = [
        _insn(_LDX_MEM_W, dst=2, src=1, off=0),
        _insn(_ALU64_AND_K, dst=2, imm=0xFFFF),
        _insn(_LDX_MEM_W, dst=3, src=1, off=4),
        _insn(_LDX_MEM_W, dst=4, src=1, off=8),
        _insn(_JMP_JNE_K, dst=2, off=_BLOCK * len(denied), imm=BPF_DEVCG_DEV_CHAR),
    ]
    for major, minor in denied:
        code += [
            _insn(_JMP_JNE_K, dst=3, off=3, imm=major),
            _insn(_JMP_JNE_K, dst=4, off=2, imm=minor),
            _insn(_ALU64_MOV_K, dst=0, imm=0),
            _insn(_JMP_EXIT),
        ]
    code += [_insn(_ALU64_MOV_K, dst=0, imm=1), _insn(_JMP_EXIT)]
    return b"".join(code)


def parse_rules(rules: Iterable[str]) -> list[tuple[int, int]]:
    """The (major, minor) pairs of cgroup v1 `devices.deny` lines (`c M:m rwm`), the form
    gpusched.processes.devices writes them in; ValueError on any other line."""
    pairs: list[tuple[int, int]] = []
    for rule in rules:
        match = _RULE.match(rule)
        if match is None:
            raise ValueError(f"not a character device rule: {rule!r}")
        pairs.append((int(match.group(1)), int(match.group(2))))
    return pairs


def _bpf(cmd: int, attr: bytes) -> int:
    number = _SYSCALL_BPF.get(platform.machine())
    if number is None:
        raise ProgramError(0, f"bpf(2) is not known on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, len(attr))
    result = int(libc.syscall(number, cmd, buf, len(attr)))
    if result < 0:
        err = ctypes.get_errno()
        raise ProgramError(err, os.strerror(err))
    return result


def _load(insns: bytes, log: ctypes.Array[ctypes.c_char] | None) -> int:
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    # union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level,
    # log_size, log_buf, kern_version, prog_flags, prog_name[16]; the rest zero.
    attr = struct.pack(
        "<IIQQIIQII16s",
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(insns) // 8,
        ctypes.addressof(code),
        ctypes.addressof(license_),
        0 if log is None else 1,
        0 if log is None else len(log),
        0 if log is None else ctypes.addressof(log),
        0,
        0,
        b"gpusched_devs",
    )
    return _bpf(BPF_PROG_LOAD, attr.ljust(128, b"\0"))


def load(denied: Sequence[tuple[int, int]]) -> int:
    """Load the program; its file descriptor (the caller closes it). ProgramError, with
    the verifier's last word where it has one, where the kernel refuses."""
    insns = assemble(denied)
    try:
        return _load(insns, None)
    except ProgramError as exc:
        # Again with the verifier's log, for the reason only: a log too small for a long
        # program is itself an error (ENOSPC), so the first try goes without one.
        log = ctypes.create_string_buffer(65536)
        with contextlib.suppress(ProgramError):
            os.close(_load(insns, log))
        said = log.value.decode(errors="replace").strip().splitlines()
        detail = f" ({said[-1]})" if said else ""
        raise ProgramError(exc.errno, f"cannot load a BPF device program: {exc}{detail}") from None


def attach(cgroup_dir: Path, program: int) -> None:
    """Attach a loaded program to a cgroup v2 directory, beside those already there."""
    target = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # BPF_PROG_ATTACH: target_fd, attach_bpf_fd, attach_type, attach_flags.
        attr = struct.pack("<IIII", target, program, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
        try:
            _bpf(BPF_PROG_ATTACH, attr.ljust(128, b"\0"))
        except ProgramError as exc:
            raise ProgramError(
                exc.errno, f"cannot attach a BPF device program to {cgroup_dir}: {exc}"
            ) from None
    finally:
        os.close(target)


def fence(cgroup_dir: Path, denied: Sequence[tuple[int, int]]) -> None:
    """Deny `denied` to every process of the cgroup v2 `cgroup_dir` (and of its children)
    from now on, for as long as the cgroup exists. ProgramError where refused."""
    program = load(denied)
    try:
        attach(cgroup_dir, program)
    finally:
        os.close(program)


def unavailable() -> str | None:
    """Why no BPF device program can be loaded here, in one line (None: one can). Loads
    and drops an empty one: the daemon asks at its start, `gpusched doctor` too."""
    try:
        program = load([])
    except ProgramError as exc:
        return str(exc)
    with contextlib.suppress(OSError):
        os.close(program)
    return None
