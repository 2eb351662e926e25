"""Which operators of a digits-preset training step scale with the number of CPU threads.

One process, one model: a training step (forward, backward, RAdam) is profiled with `torch.profiler` at each
thread count in turn, after two warm-up steps, and the heaviest operators are printed with their self CPU time
per thread count and the speed-up over the first. An operator whose speed-up stays near 1 runs serially.

    PYTHONPATH=src python benchmarks/profile_threads.py [--batch-size 64] [--threads 1 2] [--top 30]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification


def self_cpu_seconds(step, threads: int) -> tuple[float, dict[str, float]]:
    """Wall time of one timed step, and self CPU seconds per operator of one profiled step, at `threads`."""
    torch.set_num_threads(threads)
    step()
    start = time.perf_counter()
    step()
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return wall, {event.key: event.self_cpu_time_total / 1e6 for event in prof.key_averages()}


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="Thread counts, in order.")
    parser.add_argument("--top", type=int, default=30, help="Operators to print, heaviest first.")
    parser.add_argument("--preset", default="digits")
    args = parser.parse_args(argv)
    if len(set(args.threads)) != len(args.threads) or min(args.threads) < 1:
        parser.error(f"--threads expects distinct positive thread counts, got {args.threads}")

    torch.manual_seed(0)
    config = NeuralInterpreterConfig.from_paper(args.preset)
    model = NeuralInterpreterForImageClassification(config)
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-4)
    b = args.batch_size
    pixels = torch.randn(b, config.num_channels, config.image_size, config.image_size)
    task_ids = torch.randint(0, len(config.task_names), (b,))
    labels = torch.randint(0, config.num_labels, (b,))

    def step() -> None:
        model(pixel_values=pixels, task_ids=task_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    per_threads: dict[int, dict[str, float]] = {}
    for threads in args.threads:
        wall, per_threads[threads] = self_cpu_seconds(step, threads)
        total = sum(per_threads[threads].values())
        print(f"{threads} thread(s): step {wall:.3f} s wall, {total:.3f} s self CPU time profiled")

    first = per_threads[args.threads[0]]
    header = " ".join(f"{t:>8d}t" for t in args.threads)
    print(f"{'operator':60s} {header}  speed-up over {args.threads[0]} thread(s)")
    for name in sorted(first, key=first.get, reverse=True)[: args.top]:
        times = [per_threads[t].get(name, 0.0) for t in args.threads]
        speedups = " ".join(f"{first[name] / max(s, 1e-9):5.2f}" for s in times[1:])
        print(f"{name[:60]:60s} {' '.join(f'{s:9.3f}' for s in times)}  {speedups}")
    return per_threads


if __name__ == "__main__":
    main()
