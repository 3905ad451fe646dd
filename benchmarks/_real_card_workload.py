"""The GPU loops of the real-card check (benchmarks/real_card.py), run as separate processes.

    python _real_card_workload.py KIND [--seconds S] [--barrier DIR --count N] [--result FILE]
                                       [--alloc SIZE_GIB] [--burst N]

KIND is the kind of job FIELD.md's sharing table names: C, bf16 matmuls back to back (about
100 % busy); S, a ~4 ms burst of the same then 0.1 s waiting "for data" (a few % busy); M, a
1 GiB elementwise read-modify-write (memory-bound); A, allocate --alloc GiB and hold it.

With --barrier, every process warms up, then waits until N processes are ready, so that the
steps counted in the next --seconds are all taken while the N share the card. The result (steps
per second in that window) goes to --result as JSON, and to stdout. An S job calibrates its
burst alone and says its size; --burst N gives later runs the same burst beside others.

Needs PyTorch with CUDA: it runs only on the device machine, never in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

DATA_WAIT_S = 0.1
BURST_S = 0.004


def _matmul_step(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.matmul(a, b)


def _burst_size(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many matmuls take about BURST_S on this card, alone."""
    for _ in range(5):  # the first products load cuBLAS's kernels: far slower than the rest
        _matmul_step(a, b)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        _matmul_step(a, b)
    torch.cuda.synchronize()
    per = (time.perf_counter() - start) / 20
    return max(1, round(BURST_S / per))


def _wait_for_others(barrier: Path, count: int) -> None:
    (barrier / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < count:
        if time.monotonic() > deadline:
            raise SystemExit("barrier: the other processes never got ready")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["C", "S", "M", "A"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--barrier", type=Path)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--result", type=Path)
    parser.add_argument("--alloc", type=float, default=0.0)
    parser.add_argument("--burst", type=int, default=0, help="S: matmuls per burst (0: calibrate)")
    args = parser.parse_args()

    device = torch.device("cuda")
    if args.kind == "A":
        held = torch.empty(int(args.alloc * 2**30), dtype=torch.uint8, device=device)
        held.fill_(1)
        torch.cuda.synchronize()
        print(f"allocated {args.alloc} GiB", flush=True)
        time.sleep(args.seconds)
        return
    if args.kind == "M":
        x = torch.ones(2**28, dtype=torch.float32, device=device)  # 1 GiB

        def step() -> None:
            x.mul_(1.0000001).add_(1e-7)
            torch.cuda.synchronize()

    else:
        n = 8192 if args.kind == "C" else 4096
        a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
        b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
        burst = 1
        if args.kind == "S":
            burst = args.burst or _burst_size(a, b)

        def step() -> None:
            for _ in range(burst):
                _matmul_step(a, b)
            torch.cuda.synchronize()
            if args.kind == "S":
                time.sleep(DATA_WAIT_S)

    warm_until = time.monotonic() + 1.5
    while time.monotonic() < warm_until:
        step()
    if args.barrier is not None:
        _wait_for_others(args.barrier, args.count)
    steps = 0
    start = time.perf_counter()
    end = start + args.seconds
    while time.perf_counter() < end:
        step()
        steps += 1
    rate = steps / (time.perf_counter() - start)
    result = {"kind": args.kind, "pid": os.getpid(), "steps_per_s": rate}
    if args.kind == "S":
        result["burst"] = burst
    print(json.dumps(result), flush=True)
    if args.result is not None:
        args.result.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
