"""A fake GPU job for the fake NVML driver: it "allocates" memory by registering its pid.

    python tests/fakenvml/gpujob.py --lag 2 --mem 10G [--hold 30] [--util 80] [--child]
                                    [--grow 14G --grow-after 5] [--exit-code N]

Reads CUDA_VISIBLE_DEVICES (NVML indices, UUIDs or unique UUID prefixes; unset means every
GPU, empty means none) and FAKENVML_STATE, waits --lag seconds (the allocation lag a real
framework has while it starts), then registers --mem on each visible GPU under its own pid,
prints one line per GPU, holds for --hold seconds and exits with --exit-code. The memory
disappears from the fake driver when the process exits, as on a real driver.

--child makes a forked child hold the memory (the parent waits for it and exits with its
code), so tests can check that a job's process tree is attributed to the job.

To raise the memory while the job runs, either pass --grow SIZE [--grow-after S] (counted
from the allocation, within --hold), or call state.register_process() from the test with the
pid the job printed: a registration replaces what that pid held on that GPU.

--util-cycle 0,95,10,90 [--util-period 0.35] makes the job's SM utilization swing: during
--hold it steps through the values, one per period, round and round (a job starved of data,
or one taking turns with another busy job on a shared card). --sample-every N gives its
per-process utilization no sample in M of every N polls with --sample-missing M (as on a
shared real card).

Stdlib only (plus the state module next to this file).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fakenvml import state as fakestate  # found through the path above

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    match = _SIZE_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}, e.g. 10G or 512M")
    number, suffix = match.groups()
    return int(float(number) * 1024 ** "BKMGT".index(suffix.upper() or "B"))


def say(message: str) -> None:
    print(f"gpujob[{os.getpid()}]: {message}", flush=True)


def visible_gpus(state_path: str) -> list[tuple[int, str]]:
    """(NVML index, uuid) of each GPU in CUDA_VISIBLE_DEVICES, in that order."""
    gpus = fakestate.read_state(state_path)
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [(i, g.uuid) for i, g in enumerate(gpus.gpus)]
    out = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        try:
            index = fakestate.find_gpu(gpus, entry)
        except LookupError:
            # Fail loudly: a scheduler bug here would otherwise look like a quiet CPU-only run.
            raise SystemExit(f"gpujob: CUDA_VISIBLE_DEVICES={spec!r}: no GPU {entry!r}") from None
        out.append((index, gpus.gpus[index].uuid))
    return out


def play(args: argparse.Namespace, state_path: str) -> int:
    gpus = visible_gpus(state_path)
    sampling = {"sample_every": args.sample_every, "sample_missing": args.sample_missing}
    say(f"visible GPUs {[i for i, _ in gpus]}; allocating in {args.lag:g}s")
    time.sleep(args.lag)
    if args.mem:
        for index, uuid in gpus:
            fakestate.register_process(
                state_path, uuid, os.getpid(), args.mem, sm_util=args.util, **sampling
            )
            say(f"allocated {args.mem} bytes on GPU {index} ({uuid})")
    hold = args.hold
    held = args.mem
    if args.grow is not None:
        before = min(args.grow_after, hold)
        time.sleep(before)
        hold -= before
        for index, uuid in gpus:
            fakestate.register_process(
                state_path, uuid, os.getpid(), args.grow, sm_util=args.util, **sampling
            )
            say(f"grew to {args.grow} bytes on GPU {index} ({uuid})")
        held = args.grow
    if args.util_cycle and held:
        cycle = [int(v) for v in args.util_cycle.split(",")]
        deadline = time.monotonic() + hold
        step = 0
        while time.monotonic() < deadline:
            for _, uuid in gpus:
                util = cycle[step % len(cycle)]
                fakestate.register_process(
                    state_path, uuid, os.getpid(), held, sm_util=util, **sampling
                )
            step += 1
            time.sleep(max(0.0, min(args.util_period, deadline - time.monotonic())))
    else:
        time.sleep(hold)
    say(f"done, exit code {args.exit_code}")
    return int(args.exit_code)


def run_in_child(args: argparse.Namespace, state_path: str) -> int:
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = play(args, state_path)
        finally:
            os._exit(code)  # no atexit handlers, no flushing the parent's buffers twice

    def forward(signum: int, _frame: object) -> None:
        os.kill(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    say(f"started child {child}")
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lag", type=float, default=0.0, help="seconds before allocating")
    parser.add_argument("--mem", type=parse_size, default=0, help="memory per visible GPU")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to hold it")
    parser.add_argument("--util", type=int, default=None, help="SM utilization percent")
    parser.add_argument("--util-cycle", default=None, help="utilization values to cycle, 0,95")
    parser.add_argument("--util-period", type=float, default=0.35, help="seconds per value")
    parser.add_argument("--sample-every", type=int, default=1, help="in each N polls...")
    parser.add_argument("--sample-missing", type=int, default=0, help="...M have no sample")
    parser.add_argument("--grow", type=parse_size, default=None, help="memory after growing")
    parser.add_argument("--grow-after", type=float, default=1.0, help="seconds after alloc")
    parser.add_argument("--child", action="store_true", help="allocate from a child process")
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args(argv)
    state_path = os.environ.get("FAKENVML_STATE")
    if not state_path:
        raise SystemExit("gpujob: FAKENVML_STATE is not set")
    return run_in_child(args, state_path) if args.child else play(args, state_path)


if __name__ == "__main__":
    sys.exit(main())
